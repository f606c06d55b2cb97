"""What vLLM cannot run is refused before a run starts, naming the field (the engine's own
behaviour behind each rule is in ``tests/vllm/test_vllm_families.py``)."""

from __future__ import annotations

import dataclasses

from asyncrl.actors.engines.vllm.model_checks import vllm_model_problems
from asyncrl.actors.policy.checkpoint import load_model


def embedded():
    model, _ = load_model("embedded")
    return model.config


def test_the_embedded_model_runs_in_vllm_on_cpu_and_cuda() -> None:
    assert vllm_model_problems(embedded(), device="cpu") == []
    assert vllm_model_problems(embedded(), device="cuda") == []


def test_a_head_size_vllm_cannot_attend_with_on_cpu_is_named() -> None:
    config = dataclasses.replace(embedded(), head_dim=12)
    (problem,) = vllm_model_problems(config, device="cpu")
    assert "head_dim=12" in problem and "32, 64" in problem
    assert vllm_model_problems(config, device="cuda") == []


def test_sliding_windows_on_some_layers_and_qwen3_output_biases_are_named() -> None:
    config = dataclasses.replace(
        embedded(),
        architecture="Qwen2ForCausalLM",
        attention_bias=True,
        sliding_window=4,
        layer_types=("sliding_attention", "full_attention", "full_attention", "full_attention"),
    )
    (problem,) = vllm_model_problems(config, device="cuda")
    assert "some layers only" in problem
    qwen3 = dataclasses.replace(embedded(), architecture="Qwen3ForCausalLM", attention_bias=True)
    (problem,) = vllm_model_problems(qwen3, device="cuda")
    assert "attention_bias=true" in problem and "o_proj" in problem
