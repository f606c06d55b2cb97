"""The default run across three hosts (tests/support/hosts.py), as on a cluster: the bus
over TCP with CURVE, payloads fetched between hosts, weights over UCX from the trainer's
host to the generator's, only the run directory shared."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from asyncrl.runtime.cli._runs import replay_journal
from asyncrl.runtime.rundir import RunDir
from tests.support.hosts import Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    pytest.mark.timeout(240),
]

STEPS = 10
# The scheduler's host runs the dataloader; the generator's, the reward; the trainer's,
# logp: so payloads and weights cross hosts, and also stay on one where they can.
PLACEMENT = {"h1": ["dataloader"], "h2": ["generate", "reward"], "h3": ["train", "logp"]}


def lines(path: Path) -> list[dict]:
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def test_the_default_run_across_three_hosts_with_curve(tmp_path: Path) -> None:
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    with Hosts(3, shared=[tmp_path]) as hosts:
        control = f"tcp://{hosts.address('h1')}:5555"
        overrides = [
            f"run.dir={run_dir}",
            f"run.total_steps={STEPS}",
            f"scheduler.host={hosts.address('h1')}",
            "scheduler.curve='on'",
            "scheduler.control_port=5555",
            "scheduler.events_port=5556",
        ]
        config = ["-c", "deploy/configs/default.yaml", *overrides]
        scheduler_cli = [sys.executable, "-m", "asyncrl.runtime.cli.scheduler"]
        hosts.run("h1", [*scheduler_cli, "keygen", str(run_dir / "keys")])
        scheduler = hosts.start(
            "h1", [*scheduler_cli, "start", *config], log=logs / "scheduler.log"
        )
        worker_cli = [sys.executable, "-m", "asyncrl.actors.cli", "--scheduler", control]
        workers = [
            hosts.start(host, [*worker_cli, "--role", role, *config], log=logs / f"{role}.log")
            for host, roles in PLACEMENT.items()
            for role in roles
        ]
        try:
            assert scheduler.wait(180) == 0, (logs / "scheduler.log").read_text()[-3000:]
        except BaseException:
            for log in sorted(logs.iterdir()):
                print(f"--- {log.name}\n{log.read_text()[-2000:]}")
            raise
        for worker in workers:
            assert worker.wait(30) == 0
        traffic = {name: hosts.counters(name) for name in hosts.names()}

    metrics = lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    trained = Counter(key for m in metrics for key in m["keys"])
    assert len(trained) == STEPS * 8 and set(trained.values()) == {1}
    fates = replay_journal(RunDir(run_dir))
    assert fates["groups"].get("trained") == STEPS * 8 and not fates["groups"].get("dead")
    # Weights went over UCX from the trainer's host to the generator's, and were mapped
    # from shared memory by logp beside the trainer; the bytes crossed h3's link.
    loads = lines(run_dir / "weights.jsonl")
    across = [m for m in loads if m["worker"].startswith("generate-h2")]
    assert across and all(m["source"].startswith("train-h3") for m in across)
    assert any(m["worker"].startswith("logp-h3") for m in loads)
    sent = sum(m["bytes"] for m in across)
    assert traffic["h3"].sent > sent and traffic["h2"].received > sent
