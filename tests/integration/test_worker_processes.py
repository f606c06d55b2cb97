"""``asyncrl-worker`` as real processes against a real scheduler process, over ZeroMQ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.demo_pipeline import ROLES, WORK_ENV, expected_value, prompt_key

BIN = Path(sys.executable).parent
STEPS, BATCH = 6, 4


def start(script: str, *args: str | Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, WORK_ENV: "logp=0.1"}  # logp leases last long enough to be cut
    with open(log, "wb") as out:
        command = [str(BIN / script), *map(str, args)]
        return subprocess.Popen(command, stdout=out, stderr=out, env=env)


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def worker_args(role: str, index: int, config: Path) -> tuple[str, ...]:
    return ("asyncrl-worker", "--role", role, "--index", str(index), "-c", str(config))


def steps_done(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def test_worker_processes_run_the_demo_and_a_terminated_one_leaves_cleanly(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        f"run: {{dir: {tmp_path / 'run'}, total_steps: {STEPS}}}\n"
        f"pipeline: {{train_batch_groups: {BATCH}, lease_timeout_s: 10,"
        " actors: tests.support.demo_pipeline}\n"
        "algorithm: {kl_coef: 0.01}\n"  # the demo runs every stage, ref_logp included
        "scheduler: {control_port: 0, events_port: 0, heartbeat_interval_s: 0.5}\n"
    )
    metrics = tmp_path / "run" / "metrics.jsonl"
    scheduler = start("asyncrl-scheduler", "start", "-c", config, log=tmp_path / "scheduler.log")
    workers = {
        role: start(*worker_args(role, 0, config), log=tmp_path / f"{role}-0.log") for role in ROLES
    }
    try:
        wait_for(lambda: steps_done(metrics) >= 1, 60, "the first step")
        workers["logp"].send_signal(signal.SIGTERM)
        assert workers["logp"].wait(30) == 0, (tmp_path / "logp-0.log").read_text()
        workers["logp"] = start(*worker_args("logp", 1, config), log=tmp_path / "logp-1.log")
        for role, proc in workers.items():
            assert proc.wait(60) == 0, (tmp_path / f"{role}-0.log").read_text()[-2000:]
        assert scheduler.wait(30) == 0
    finally:
        for proc in [scheduler, *workers.values()]:
            if proc.poll() is None:
                proc.kill()
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    trained = {key: value for line in lines for key, value in line["groups"].items()}
    assert sum(len(line["groups"]) for line in lines) == len(trained)  # each key once
    assert trained == {prompt_key(i): expected_value(i) for i in range(STEPS * BATCH)}
