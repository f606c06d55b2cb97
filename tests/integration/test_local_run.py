"""``asyncrl run``: the whole pipeline from one command, Ctrl-C, and --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.cluster import ROLES, Cluster, free_port, processes_mentioning, wait_for

pytestmark = pytest.mark.timeout(180)


def asyncrl_run(c: Cluster, *extra: str, work: str = "") -> subprocess.Popen[bytes]:
    log = open(c.logs / "asyncrl-run.log", "ab")  # noqa: SIM115 - the child owns it
    argv = [
        sys.executable,
        "-m",
        "asyncrl.runtime.launch.cli.main",
        "run",
        "-c",
        str(c.config_path),
    ]
    env = {**os.environ, "ASYNCRL_DEMO_WORK_S": work}  # the supervisor passes it on
    return subprocess.Popen([*argv, *extra], stdout=log, stderr=subprocess.STDOUT, env=env)


def test_one_command_runs_the_pipeline_to_the_end(tmp_path: Path) -> None:
    c = Cluster(tmp_path, run={"total_steps": 8})
    proc = asyncrl_run(c)
    assert proc.wait(150) == 0, c.log_text("asyncrl-run")
    c.check_exactly_once()
    run_logs = c.run_dir / "logs"
    for name in ("scheduler", *(f"{role}-0" for role in ROLES)):
        lines = (run_logs / f"{name}.log").read_text().splitlines()
        records = [json.loads(line) for line in lines if line.startswith("{")]
        assert records and all(r["process"] == name for r in records), name
    assert "step 8/8" in c.log_text("asyncrl-run")
    assert processes_mentioning(str(c.config_path)) == []
    # A local run's bus: ipc:// sockets in a directory closed to other users, no TCP port.
    listening = [
        json.loads(line)
        for line in (run_logs / "scheduler.log").read_text().splitlines()
        if '"scheduler listening"' in line
    ]
    control = listening[0]["control"]
    assert control.startswith("ipc://"), control
    bus = Path(control.removeprefix("ipc://")).parent
    assert bus.stat().st_mode & 0o777 == 0o700 and bus.parent.stat().st_mode & 0o077 == 0


def test_configured_ports_of_a_local_run_are_not_dialled_its_workers_find_the_ipc_bus(
    tmp_path: Path,
) -> None:
    # The scheduler of a local run serves ipc:// only; a worker that started before it
    # announced itself used to dial the configured TCP ports, where nothing listens.
    control, events = free_port(), free_port()
    c = Cluster(tmp_path, run={"total_steps": 4},
                scheduler={"control_port": control, "events_port": events})  # fmt: skip
    proc = asyncrl_run(c)
    try:
        assert proc.wait(90) == 0, c.log_text("asyncrl-run")[-3000:]
    finally:
        if proc.poll() is None:  # stalled: nothing of it may outlive the test
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
    c.check_exactly_once()


def test_ctrl_c_stops_everything_and_resume_finishes_the_run_exactly(tmp_path: Path) -> None:
    c = Cluster(tmp_path, run={"total_steps": 1000})
    proc = asyncrl_run(c, work="train=0.1")
    wait_for(lambda: c.steps_done() >= 3, 90, "three train steps")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    assert wait_for(lambda: not processes_mentioning(str(c.config_path)), 10, "no process left")
    done = c.steps_done()
    assert done < 1000
    c.config["run"]["total_steps"] = done + 4
    c.config_path.write_text(yaml.safe_dump(c.config))
    again = asyncrl_run(c, "--resume")
    assert again.wait(150) == 0, c.log_text("asyncrl-run")
    c.check_exactly_once()
    time.sleep(0.2)
    assert processes_mentioning(str(c.config_path)) == []


def test_a_scheduler_killed_under_asyncrl_run_is_resumed_and_the_run_ends_exact(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path, run={"total_steps": 12})
    proc = asyncrl_run(c, work="train=0.2,generate=0.05")
    wait_for(lambda: c.steps_done() >= 3, 90, "three train steps")
    found = c.endpoints()
    assert found is not None
    os.kill(found["pid"], signal.SIGKILL)
    assert proc.wait(150) == 0, c.log_text("asyncrl-run")  # nobody typed --resume
    c.check_exactly_once()
    text = c.log_text("asyncrl-run")
    assert "restarting scheduler" in text and "started scheduler" in text
    # The workers went on with the resumed scheduler: none of them was restarted.
    assert "restarting generate-0" not in text and "restarting train-0" not in text
