"""``asyncrl run`` on a model directory made by transformers: a tiny random Qwen3, and
a tiny random Qwen3-MoE.

The default configuration, with the model, the length and small batches changed, runs
to its last step on a Qwen3 (per-head q/k norms, head_dim apart from hidden/heads) and on
a Qwen3-MoE (its experts in place of every MLP), and the final model it writes loads in
transformers as the same class with the logits ours computes. A random model earns
nothing on the task's own reward, so a reward plug-in that pays for digits makes the
weights move: the final model is a trained one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.model_dir_check import check_model_dir
from tests.support.hf_families import TASK_MODEL_KINDS, tiny_task_model

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(150)

DEFAULT = Path(__file__).parents[2] / "deploy" / "configs" / "default.yaml"
STEPS = 5


@pytest.mark.parametrize(
    "model_type",
    # The first family by default, the others with the heavy tests (about 16 s each in CI):
    # the same run on another directory's shape.
    [
        pytest.param(kind, marks=[pytest.mark.heavy] if i else [])
        for i, kind in enumerate(sorted(TASK_MODEL_KINDS))
    ],
)
def test_a_run_on_a_qwen3_directory_ends_and_its_final_model_loads_in_transformers(
    tmp_path: Path, model_type: str
) -> None:
    model_dir = tiny_task_model(tmp_path / model_type, model_type)
    check_model_dir(str(model_dir))
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={model_dir}",
        f"run.total_steps={STEPS}",
        f"run.dir={run_dir}",
        "model.max_new_tokens=16",
        "data.group_size=4",
        "data.val_every_versions=0",
        "data.reward=tests.support.tasks:digits_reward",
        "pipeline.train_batch_groups=2",
        "algorithm.micro_batch_groups=1",
        "algorithm.proximal_logp=recompute",  # logp scores every group: the gap is measured
        "scheduler.control_port=0",  # other runs on this machine may hold the defaults
        "scheduler.events_port=0",
    ]
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", str(DEFAULT)]
    result = subprocess.run(
        [*argv, *overrides], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # The decoder's KV-cache log-probs and the trainer's whole-sequence ones agree.
    # (reported for steps with tokens sampled by the version that scored them)
    mismatches = [s["logprob_mismatch_mean"] for s in steps if "logprob_mismatch_mean" in s]
    assert mismatches and max(mismatches) < 1e-4
    assert any(s["grad_norm"] > 0 for s in steps)

    final = run_dir / "final"
    theirs = transformers.AutoModelForCausalLM.from_pretrained(final).eval()
    assert type(theirs).__name__ == TASK_MODEL_KINDS[model_type][0]
    ours, codec = load_model(str(final))
    ids = torch.tensor([codec.encode("4589+123=9+3+0=12,"), codec.encode("77+8=7+8+0=15;0085")])
    with torch.no_grad():
        assert (ours(ids) - theirs(ids).logits).abs().max() <= 1e-5
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert not torch.equal(base.lm_head.weight, theirs.lm_head.weight), "the run trained"
