"""A host's link cut for 20 s, then restored, under the default run over three hosts
(tests/support/hosts.py): the generator's host falls silent, its workers are declared
lost and register again once it is back, and the run goes on to its end with every step
once and every group trained once; weights reach the generator again over UCX from the
same trainer, whose process and UCX worker lived through the cut, as did the generator's.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.host_run import HostRun, lines
from tests.support.hosts import HOST_KINDS, HostKind, Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    # As machines, and as containers on one kernel (its boot id and IPC namespace shared).
    pytest.mark.parametrize("kind", HOST_KINDS),
    pytest.mark.timeout(420),
    pytest.mark.heavy,
]

STEPS = 30
CUT_S = 20.0  # longer than the scheduler's 15 s without a heartbeat: workers are lost
SLOW = "8mbit"  # a version (3 MB) takes 3 s to cross
PLACEMENT = {"h1": "dataloader,reward", "h2": "generate", "h3": "train,logp"}


def test_a_link_cut_for_20_s_then_restored(tmp_path: Path, kind: HostKind) -> None:
    with Hosts(3, shared=[tmp_path], kind=kind) as hosts:
        run = HostRun(hosts, tmp_path, overrides=[f"run.total_steps={STEPS}"])
        run.start(PLACEMENT)
        run.wait_for_steps(4, timeout_s=120)
        # Slowed first, so that a version is still on its way to the generator when the
        # link goes: the trainer's send is then cut off mid-way, as on a busy cluster.
        hosts.limit_rate("h2", SLOW)
        time.sleep(2)
        hosts.cut_link("h2")
        time.sleep(CUT_S)
        at_restore = len(run.steps())
        loaded_before = _generator_loads(run)
        hosts.restore_link("h2")
        hosts.clear_limit("h2")
        run.finish(timeout_s=240)
    run.check_exactly_once(STEPS)
    assert at_restore < STEPS, "the run ended before the link came back: nothing was tested"
    # The generator was lost while cut off, and registered again once it was back.
    scheduler = lines(run.run_dir / "logs" / "scheduler.log")
    lost = [
        e for e in scheduler
        if e["event"] == "worker lost" and _generator(e) and "heartbeat" in str(e["reason"])
    ]  # fmt: skip
    registered = [e for e in scheduler if e["event"] == "worker registered" and _generator(e)]
    assert lost and len(registered) >= 2, run.tails()
    # Weights kept flowing to it from the trainer across h3's link after the restore.
    after = [m for m in _generator_loads(run)[len(loaded_before) :] if m["source"] == "train-0"]
    assert after, f"no version reached the generator after the restore\n{run.tails()}"


def _generator(event: dict[str, object]) -> bool:
    return str(event.get("worker", "")).startswith("generate-h2")


def _generator_loads(run: HostRun) -> list[dict[str, object]]:
    return [m for m in lines(run.run_dir / "weights.jsonl") if m["worker"].startswith("generate")]
