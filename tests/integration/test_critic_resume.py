"""``asyncrl run`` of PPO (algorithm.estimator=gae, real processes) with its critic killed
by SIGKILL after a critic step: the restarted critic takes up exactly the critic step the
scheduler counts, bit for bit the state its predecessor staged, and no completed critic
step is lost; the run ends with every policy step, the critic's staleness in each line.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from asyncrl.runtime.contract.rundir import RunDir
from tests.support import default_run

pytestmark = pytest.mark.timeout(300)

_STEPS, _BATCH, _KILL_AFTER = 8, 4, 3
_staged, _steps = default_run.records, default_run.steps


# With the heavy tests (23 s), to keep the default suite under its time; the critic's
# checkpoints and its rollback in the core have unit tests in the default suite.
@pytest.mark.heavy
def test_a_killed_critic_resumes_at_the_scheduler_critic_step(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    # Its lower layers frozen, as ppo.yaml has it: the staged state holds the layers that
    # learn, and the restarted critic takes the frozen ones from its model directory.
    proc = default_run.start_ppo(run_dir, log, _STEPS, _BATCH, "critic.frozen_layers=2")
    try:
        deadline = time.monotonic() + 150
        while len(_staged(run_dir, "critic-0", "state staged")) < _KILL_AFTER:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no {_KILL_AFTER} critic steps within 150 s"
            time.sleep(0.01)
        os.kill(default_run.pid_of(log, "critic-0"), signal.SIGKILL)
        assert proc.wait(200) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(RunDir(run_dir).critic_staged_state, ignore_errors=True)
    assert log.read_text().count("started critic-0") == 2  # killed once, started again

    staged = _staged(run_dir, "critic-0", "state staged")
    restored = _staged(run_dir, "critic-0", "critic state restored")
    assert [r["step"] for r in restored][:1] == [0]  # the first start: the base model
    assert len(restored) == 2, restored
    again = restored[1]
    # Restored from memory, at a step the scheduler had counted when the kill came ...
    assert again["source"] == "staged" and again["step"] >= _KILL_AFTER - 1, again
    # ... bit for bit the state the killed critic staged after that step ...
    before = [r for r in staged if r["step"] == again["step"]]
    assert before and before[0]["checksum"] == again["checksum"], (again, before)
    # ... and every critic step staged once in order, but one staged and lost with its
    # process before it counted, staged again: no completed critic step lost.
    numbers = [r["step"] for r in staged]
    assert all(b <= a + 1 for a, b in itertools.pairwise(numbers)), numbers
    assert sorted(set(numbers)) == list(range(1, numbers[-1] + 1)), numbers

    steps = _steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, _STEPS + 1))
    keys = [key for s in steps for key in s["keys"]]
    assert len(keys) == len(set(keys)) == _STEPS * _BATCH  # no group trained twice
    for line in steps:  # the critic's staleness, within the bound, in every line
        assert 0 <= line["critic_staleness_max"] <= 2, line
    assert not RunDir(run_dir).critic_staged_state.exists()  # the run ended: nothing left
