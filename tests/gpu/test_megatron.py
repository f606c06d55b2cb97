"""The megatron engine on CUDA: logits against the torch engine, and short RL runs with
``backends.train=megatron`` on the embedded model and on a tiny Qwen3-MoE.

Marked ``gpu``: skipped where torch sees no CUDA device or megatron-core is not installed
(``pip install 'asyncrl[gpu]'``). Written for megatron's local layer spec: the machines it
targets have no Transformer Engine or apex.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from tests.support.hf_families import tiny_task_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.timeout(600),
]


def test_megatron_logits_on_cuda_match_the_torch_engine_in_fp32() -> None:
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state

    from asyncrl.actors.engines.megatron.model import load_megatron
    from asyncrl.runtime.contract.config import MegatronSection

    cpu, _ = load_model("embedded")
    torch.cuda.set_device(0)
    try:
        model, _ = load_megatron(
            "embedded", torch.bfloat16, torch.device("cuda", 0), MegatronSection()
        )
        ids = torch.randint(3, cpu.config.vocab_size, (3, 24))
        with torch.no_grad():
            expected = cpu(ids)
            got = model.eval()(ids.cuda()).float().cpu()
        assert (got - expected).abs().max() <= 0.05 * expected.abs().max()
    finally:  # megatron's groups, and the one-rank group under them, made in this process
        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def _trained_on_cuda(tmp_path: Path, steps: int, overrides: list[str]) -> Path:
    """``asyncrl run`` of ``steps`` steps in bfloat16 on CUDA, megatron training: its run
    directory, every step checked to have trained."""
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run"]
    argv += ["-c", "deploy/configs/default.yaml", f"run.dir={run_dir}", f"run.total_steps={steps}"]
    argv += ["backends.device=cuda", "backends.train=megatron", "model.dtype=bfloat16"]
    argv += ["data.val_every_versions=0", "weights.strategy=shm", *overrides]
    argv += ["scheduler.control_port=0", "scheduler.events_port=0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [s["step"] for s in lines] == list(range(1, steps + 1))
    assert all(s["grad_norm"] > 0 for s in lines)
    return run_dir


def test_a_short_rl_run_trains_with_megatron_on_cuda(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    run_dir = _trained_on_cuda(tmp_path, 4, [])
    final, _ = load_model(str(run_dir / "final"), torch.bfloat16)
    assert final.lm_head.weight.dtype == torch.bfloat16


def _tiny_moe(directory: Path) -> Path:
    """A Qwen3-MoE (4 experts, 2 per token) holding the arithmetic task's tokenizer."""
    return tiny_task_model(directory, "qwen3_moe", tie_word_embeddings=False, norm_topk_prob=True)


def test_megatron_moe_logits_on_cuda_match_the_torch_engine(tmp_path: Path) -> None:
    """Megatron's MoE layers with its router on the GPU (its own path there) against our
    experts on CPU, float32 both, so that no routing decision differs by rounding."""
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state

    from asyncrl.actors.engines.megatron.model import load_megatron
    from asyncrl.runtime.contract.config import MegatronSection

    directory = _tiny_moe(tmp_path / "moe")
    cpu, _ = load_model(str(directory))
    torch.cuda.set_device(0)
    try:
        model, _ = load_megatron(
            str(directory), torch.float32, torch.device("cuda", 0), MegatronSection()
        )
        ids = torch.randint(3, cpu.config.vocab_size, (3, 24))
        with torch.no_grad():
            expected = cpu(ids)
            got = model.eval()(ids.cuda()).cpu()
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    finally:
        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_short_rl_run_on_a_qwen3_moe_with_megatron_on_cuda(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    directory = _tiny_moe(tmp_path / "moe")
    small = ["model.max_new_tokens=16", "data.group_size=4", "pipeline.train_batch_groups=2"]
    task = ["data.reward=tests.support.tasks:digits_reward"]
    run_dir = _trained_on_cuda(tmp_path, 3, [f"model.path={directory}", *small, *task])
    final, _ = load_model(str(run_dir / "final"))
    assert final.config.experts is not None
