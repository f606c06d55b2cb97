"""``asyncrl run`` with a worker frozen mid-run (SIGSTOP: alive, running nothing): its
supervisor kills it once its pulse has been silent long enough, with a line saying why,
restarts it, and the run ends with every step and group exactly once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, processes_mentioning, wait_for

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(240)]


@pytest.mark.parametrize("role", ["reward", "generate"])
def test_a_frozen_worker_is_killed_restarted_and_the_run_ends_exactly(
    tmp_path: Path, role: str
) -> None:
    c = Cluster(tmp_path, run={"total_steps": 12})
    command = [
        sys.executable,
        "-m",
        "asyncrl.runtime.launch.cli.main",
        "run",
        "-c",
        str(c.config_path),
    ]
    log_path = c.logs / "asyncrl-run.log"
    with log_path.open("wb") as log:
        env = {**os.environ, "ASYNCRL_DEMO_WORK_S": "train=0.2"}
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: c.steps_done() >= 3, 120, "three train steps")
        (pid,) = re.findall(rf"started {role}-0 \(pid (\d+)\)", log_path.read_text())
        os.kill(int(pid), signal.SIGSTOP)
        assert proc.wait(180) == 0, log_path.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = log_path.read_text()
    assert re.search(rf"killed {role}-0 \(pid {pid}\): alive but silent for", text), text
    assert f"restarting {role}-0" in text
    c.check_exactly_once()
    assert wait_for(lambda: not processes_mentioning(str(c.config_path)), 10, "no process left")
