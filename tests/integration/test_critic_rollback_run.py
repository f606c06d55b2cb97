"""``asyncrl run`` of PPO (real processes) where the critic's host is "lost": the critic
and the values workers beside it are killed with SIGKILL and the critic's staged state
wiped, so only the critic's checkpoints survive. The critic takes up its newest
checkpoint, the scheduler rolls the critic back to it, and the run finishes with every
policy step once: the critic lost updates only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from asyncrl.runtime.contract.rundir import RunDir
from tests.support import default_run

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(400)]

_STEPS, _BATCH, _EVERY = 8, 4, 2


def _published(run_dir: Path) -> list[int]:
    found = default_run.records(run_dir, "critic-0", "published a version")
    return [r["version"] for r in found if r.get("critic")]


def test_a_critic_whose_staged_state_is_lost_rolls_back_to_its_checkpoint(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    # With a values stage: its workers hold lost critic versions too (the rule that has
    # them leave is the part of the rollback a run without one does not meet).
    proc = default_run.start_ppo(
        run_dir, log, _STEPS, _BATCH, f"pipeline.checkpoint_every={_EVERY}", "critic.values=stage"
    )
    staged = RunDir(run_dir).critic_staged_state
    try:
        deadline = time.monotonic() + 200
        # Past the critic's checkpoint at step 2, at a step it has no checkpoint of.
        while (newest := max(_published(run_dir), default=0)) <= _EVERY or newest % _EVERY == 0:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no critic version past {_EVERY} within 200 s"
            time.sleep(0.01)
        values = sorted(set(re.findall(r"started (values-\d+) \(pid", log.read_text())))
        for name in ["critic-0", *values]:
            os.kill(default_run.pid_of(log, name), signal.SIGKILL)
        shutil.rmtree(staged)  # the host's memory went with them; the checkpoints did not
        assert proc.wait(300) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(staged, ignore_errors=True)

    restored = default_run.records(run_dir, "critic-0", "critic state restored")
    assert len(restored) == 2, restored
    again = restored[1]
    assert again["source"] == "checkpoint" and again["step"] % _EVERY == 0, again
    rolled = default_run.records(run_dir, "scheduler", "the critic rolled back")
    assert [r["step"] for r in rolled] == [again["step"]], rolled
    said = (run_dir / "logs" / "critic-0.log").read_text()
    assert said.count("rolling the critic back from step") == 1
    assert f"to step {again['step']}" in said
    # The policy lost nothing: every step once, every group trained once, in bound.
    steps = default_run.steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, _STEPS + 1))
    keys = [key for s in steps for key in s["keys"]]
    assert len(keys) == len(set(keys)) == _STEPS * _BATCH
    assert not [k for k in keys if "#rollback" in k]  # no policy step was trained again
    for line in steps:
        assert 0 <= line["critic_staleness_max"] <= 2, line
    # The critic went on from its checkpoint.
    after = [r["step"] for r in default_run.records(run_dir, "critic-0", "state staged")]
    assert after.count(again["step"]) == 1 and after[-1] > again["step"], after
    assert not staged.exists()  # the run ended: nothing left in memory
