"""``asyncrl run`` of a tiny random Qwen3-MoE with router replay (real processes): the
generator records each token's experts, logp, ref_logp and the trainer route every token
through them (our own model, or megatron's through its RouterReplay), and the run learns.
A random model earns little of the sevens reward (the share of sevens in a response,
about 0.07 at first); 40 steps raise it to 0.9 and more.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hf_families import tiny_task_model

pytestmark = pytest.mark.timeout(200)

DEFAULT = Path(__file__).parents[2] / "deploy" / "configs" / "default.yaml"
STEPS = 40


# With the heavy tests (about 20 s on 2 cores with torch, 35 s with megatron), as other
# runs of their length are.
@pytest.mark.heavy
@pytest.mark.parametrize("engine", ["torch", "megatron"])
def test_a_mixture_of_experts_run_with_router_replay_learns(tmp_path: Path, engine: str) -> None:
    if engine == "megatron":
        pytest.importorskip("megatron.core")
    model_dir = tiny_task_model(tmp_path / "moe", "qwen3_moe")
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={model_dir}",
        f"run.total_steps={STEPS}",
        f"run.dir={run_dir}",
        "model.max_new_tokens=16",
        "data.group_size=8",
        "data.val_every_versions=0",
        "data.reward=tests.support.tasks:sevens_reward",
        "pipeline.train_batch_groups=4",
        "algorithm.micro_batch_groups=2",
        "algorithm.lr=2e-3",
        "algorithm.proximal_logp=recompute",  # logp scores every group, replaying the routes
        "algorithm.router_replay.enabled=true",
        "algorithm.router_replay.ref_logp=true",
        "algorithm.kl_coef=0.001",  # a ref_logp stage, which replays them too
        "scheduler.control_port=0",  # other runs on this machine may hold the defaults
        "scheduler.events_port=0",
        f"backends.train={engine}",  # logp, ref_logp and train
    ]
    if engine == "megatron":
        overrides.append("weights.strategy=shm")  # as the other megatron runs
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", str(DEFAULT)]
    result = subprocess.run(
        [*argv, *overrides], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    rewards = [s["reward_mean"] for s in steps]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # Replayed, logp's log-probs are the generator's to float32 rounding; but for a
    # sequence whose tokens span a reload scored under the older version (its record
    # holds the newer version's routes for the whole prefix), which timing decides.
    mismatches = sorted(s["logprob_mismatch_mean"] for s in steps if "logprob_mismatch_mean" in s)
    median = mismatches[len(mismatches) // 2]
    print(
        f"\nreward: first five steps {first:.3f}, last five {last:.3f}; generator against "
        f"logp, mean |log-prob gap| a step: median {median:.1e}, max {mismatches[-1]:.1e}"
    )
    assert first < 0.3 and last > 0.7, rewards
    assert median < 1e-5
