"""A short real PPO run (``algorithm.estimator=gae``): its critic keeps to its share of the
cores as every other role does and makes the values itself (no values worker), and each
learner's step is split into its phases in the step lines and in ``asyncrl inspect``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import default_run

pytestmark = pytest.mark.timeout(240)

PHASES = ("step_s", "update_s", "stage_s", "gather_s", "checkpoint_s")


def test_a_ppo_runs_critic_keeps_to_one_core_and_inspect_splits_each_learners_step(
    tmp_path: Path,
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    proc = default_run.start_ppo(run_dir, log, 4, 2, "critic.warmup_steps=1")
    default_run.finish(proc, log, 200)
    # Left to torch, it took every core of the machine, and an asynchronous run's
    # generator waited on it (backends.cpu_threads: 1 a worker).
    (loaded,) = default_run.records(run_dir, "critic-0", "value model loaded")
    assert loaded["threads"] == 1, loaded
    # critic.values: step (the default): the critic's step made the values, at the version
    # it trained from, and no values worker ran.
    assert "started values-" not in log.read_text()
    assert not (run_dir / "logs" / "values-0.log").exists()

    steps = default_run.steps(run_dir)
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    for line in steps:
        train = [line[f"train_{phase}"] for phase in PHASES]
        assert all(seconds >= 0 for seconds in train), line
        assert train[1] + train[2] + train[3] <= train[0] + 1e-3  # the parts of the step
    assert steps[-1]["train_checkpoint_s"] > 0  # the last step writes the final model
    assert any("critic_update_s" in line for line in steps)
    critic_lines = [line for line in steps if "value_loss" in line]
    assert critic_lines and all(line["critic_staleness_max"] == 0 for line in critic_lines)

    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "inspect", str(run_dir)]
    report = json.loads(subprocess.run([*argv, "--json"], capture_output=True, check=True).stdout)
    assert set(report["learners"]) == {"train", "critic"}
    assert report["learners"]["train"]["steps"] == 4
    table = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert "Where a learner's step goes" in table and "critic" in table, table
