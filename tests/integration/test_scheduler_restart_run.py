"""``asyncrl run`` (embedded model, real processes) whose generator and scheduler are
killed by SIGKILL together: the new generator still gets the current version's weights,
though the restarted scheduler never heard them announced.

Synchronous (``pipeline.max_staleness=0``), so no group generated ahead lets the trainer
publish a new version on its own: the new generator's weights must come from the
trainer announcing its current version again when asked (``version.wanted``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support import default_run

pytestmark = pytest.mark.timeout(300)

_STEPS, _KILL_AFTER = 8, 3


def _wait(condition, timeout_s: float, what: str, proc) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"asyncrl run ended while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(0.05)


@pytest.mark.heavy  # one of the slowest default runs (15-30 s): with the heavy tests
def test_a_generator_started_after_a_scheduler_restart_gets_the_current_weights(
    tmp_path: Path,
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    proc = default_run.start(
        run_dir,
        log,
        f"run.total_steps={_STEPS}",
        "pipeline.max_staleness=0",
        "pipeline.checkpoint_every=1000",
        "data.val_every_versions=0",
    )
    try:
        _wait(lambda: len(default_run.steps(run_dir)) >= _KILL_AFTER, 150, "steps", proc)
        # Both at once: no step comes between them, so the restarted scheduler has heard
        # no announcement when the new generator asks for the weights.
        killed = default_run.pid_of(log, "generate-0")
        os.kill(killed, signal.SIGKILL)
        os.kill(default_run.pid_of(log, "scheduler"), signal.SIGKILL)
        assert proc.wait(200) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [s["step"] for s in default_run.steps(run_dir)] == list(range(1, _STEPS + 1))
    # The trainer never restarted: the weights came from it announcing them again.
    assert len(default_run.records(run_dir, "train-0", "trainer state restored")) == 1
    loaded = default_run.records(run_dir, "generate-0", "loaded a policy version")
    assert any(r["pid"] != killed and r["version"] >= _KILL_AFTER for r in loaded), loaded
