"""check_model_dir: one line per kind of unusable model directory, read without loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from asyncrl.actors.policy.model_dir_check import ModelDirError, check_model_dir
from asyncrl.actors.policy.tokenizer import build_char_tokenizer
from tests.support.models import tiny_model


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return tiny_model(tmp_path / "model")


def refusal(path: Path | str) -> str:
    with pytest.raises(ModelDirError) as caught:
        check_model_dir(str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("model.path=")
    assert isinstance(caught.value, ValueError)
    return message


def edit_config(directory: Path, **fields: Any) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


def edit_weights(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    state = load_file(str(path))
    edit(state)
    save_file(state, str(path))


def test_usable_directories_pass(good: Path, tmp_path: Path, monkeypatch) -> None:
    def no_loading(*args, **kwargs):
        raise AssertionError("check_model_dir read the tensors")

    monkeypatch.setattr("safetensors.torch.load_file", no_loading)
    check_model_dir(str(good))
    check_model_dir("embedded")


def test_usable_transformers_directories_pass_sharded_too(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from tests.support.hf_families import hf_model, save_hf_model

    model = hf_model("qwen3", head_dim=12)
    check_model_dir(str(save_hf_model(model, tmp_path / "one")))
    sharded = save_hf_model(model, tmp_path / "sharded", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    check_model_dir(str(sharded))


def test_a_missing_directory(tmp_path: Path) -> None:
    assert "no such directory" in refusal(tmp_path / "nowhere")


def test_a_directory_without_config(tmp_path: Path) -> None:
    message = refusal(tmp_path)
    assert "no config.json" in message and "Qwen3ForCausalLM" in message


def test_an_unknown_architecture_lists_the_supported_ones(good: Path) -> None:
    edit_config(good, architectures=["GPT2LMHeadModel"])
    message = refusal(good)
    assert "GPT2LMHeadModel" in message
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert arch in message


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"model_type": "qwen2"}, "model_type"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "model_type": "qwen2",
                "layer_types": ["full_attention", "sliding_attention"],
            },
            "use_sliding_window",
        ),
        (
            {
                "architectures": ["Qwen2ForCausalLM"],
                "model_type": "qwen2",
                "layer_types": ["full_attention", "chunked_attention"],
            },
            "layer_types",
        ),
    ],
)
def test_a_config_field_we_do_not_implement_is_named(
    good: Path, fields: dict[str, Any], named: str
) -> None:
    edit_config(good, **fields)
    assert named in refusal(good)


MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}
EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({}, "lacks num_experts"),
        (EXPERTS | {"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
        (EXPERTS | {"mlp_only_layers": [0]}, "mlp_only_layers=[0]"),
        (EXPERTS | {"shared_expert_intermediate_size": 8}, "shared experts"),
        (EXPERTS | {"num_experts_per_tok": 5}, "num_experts_per_tok=5"),
        (EXPERTS | {"moe_intermediate_size": 0}, "moe_intermediate_size=0"),
    ],
)
def test_a_mixture_of_experts_we_cannot_compute_is_named(
    good: Path, fields: dict[str, Any], named: str
) -> None:
    edit_config(good, **MOE, **fields)
    assert named in refusal(good)


def test_a_required_config_field_missing_is_named(good: Path) -> None:
    config = json.loads((good / "config.json").read_text())
    del config["num_attention_heads"]
    (good / "config.json").write_text(json.dumps(config))
    assert "config.json lacks num_attention_heads" in refusal(good)


def test_no_weights(good: Path) -> None:
    (good / "model.safetensors").unlink()
    assert "no model.safetensors" in refusal(good)


def test_a_missing_tensor_is_named(good: Path) -> None:
    edit_weights(good, lambda state: state.pop("model.layers.1.mlp.up_proj.weight"))
    message = refusal(good)
    assert "lack 1 tensors" in message and "model.layers.1.mlp.up_proj.weight" in message


def test_an_unexpected_tensor_is_named(good: Path) -> None:
    def add_bias(state):
        state["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)

    edit_weights(good, add_bias)
    assert "model.layers.0.self_attn.q_proj.bias" in refusal(good)


def test_a_shape_that_does_not_fit_the_config_is_named(good: Path) -> None:
    edit_config(good, intermediate_size=80)
    message = refusal(good)
    assert "mlp.gate_proj.weight is [64, 32]" in message and "needs [80, 32]" in message


def test_a_shard_the_index_names_but_is_missing(good: Path) -> None:
    shutil.move(good / "model.safetensors", good / "model-00001-of-00002.safetensors")
    names = load_file(str(good / "model-00001-of-00002.safetensors"))
    weight_map = dict.fromkeys(names, "model-00001-of-00002.safetensors")
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    index = {"metadata": {}, "weight_map": weight_map}
    (good / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "model-00002-of-00002.safetensors" in refusal(good)


def test_a_corrupt_weights_file_is_named(good: Path) -> None:
    (good / "model.safetensors").write_bytes(b"not safetensors at all")
    assert "model.safetensors is not a readable safetensors file" in refusal(good)


def test_no_tokenizer(good: Path) -> None:
    (good / "tokenizer.json").unlink()
    assert "no tokenizer.json" in refusal(good)


def test_a_tokenizer_that_does_not_load(good: Path) -> None:
    (good / "tokenizer.json").write_text("{}")
    assert "tokenizer.json does not load" in refusal(good)


def test_a_tokenizer_larger_than_the_embedding(good: Path) -> None:
    tokenizer = build_char_tokenizer("0123456789+=,;abcdefghijklmnopqrstuvwxyz")
    tokenizer.save(str(good / "tokenizer.json"))
    message = refusal(good)
    assert "vocab_size=32" in message and "tokenizer.json" in message


def test_an_eos_token_the_tokenizer_lacks(good: Path) -> None:
    config = json.loads((good / "tokenizer_config.json").read_text())
    (good / "tokenizer_config.json").write_text(json.dumps(config | {"eos_token": "<|end|>"}))
    assert "eos_token='<|end|>'" in refusal(good)
