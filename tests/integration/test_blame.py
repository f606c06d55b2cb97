"""Who is blamed when work ends badly, with real processes: a group dies only when it is
the likely cause (runtime/scheduler/core/scheduler.py).

A poison group that kills every generator taking it dies after ``max_attempts``, and the
groups leased beside it train as usual; random kills of a generator holding several
groups, and a scheduler restart, kill no group; a dead holder of logp payloads costs the
reward leases nothing, since a lease carries only what its stage reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from asyncrl.runtime.contract.config import load_config, pipeline_for
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import GroupState
from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core import journal_records as r
from asyncrl.runtime.scheduler.durable import recover
from tests.support.cluster import ROLES, Cluster, processes_mentioning, wait_for
from tests.support.demo_pipeline import expected_value, prompt_key
from tests.support.poison_roles import POISON_ENV

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(120)]

POISON = prompt_key(1)
GENERATOR = "--role generate"


def several_per_lease(tmp_path: Path, steps: int) -> Cluster:
    """A run of the demo whose generator claims 4 groups a lease, a group dying at its
    second counted try. max_staleness 3 admits 8 groups at a time: full leases.

    No fixed ports: under ``asyncrl run`` the scheduler serves on ipc:// sockets, and a
    worker that starts before it announced them would dial the configured ports instead."""
    pipeline = {"actors": "tests.support.poison_roles", "max_attempts": 2, "max_staleness": 3}
    return Cluster(tmp_path, run={"total_steps": steps}, pipeline=pipeline)


@contextmanager
def asyncrl_run(c: Cluster, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``asyncrl run`` on the cluster's config, under its supervisor (which restarts dead
    workers and resumes a dead scheduler); its output in ``asyncrl-run.log``."""
    command = [
        sys.executable,
        "-m",
        "asyncrl.runtime.launch.cli.main",
        "run",
        "-c",
        str(c.config_path),
    ]
    with open(c.logs / "asyncrl-run.log", "wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def journal(c: Cluster) -> tuple[SchedulerCore, list[r.Record]]:
    """The scheduler's state as its journal has it (read-only: the run may be live), and
    the records since the last snapshot."""
    run = RunDir(c.run_dir)
    cfg = load_config(run.config)
    core, found = recover(run.journal, CoreSettings.from_config(cfg), pipeline_for(cfg))
    return core, [r.from_journal(entry) for entry in found.records]


def dead(core: SchedulerCore) -> dict[str, str | None]:
    return {g.key: g.reason for g in core.state.groups.values() if g.state is GroupState.DEAD}


def trained_once(c: Cluster) -> set[str]:
    """Every step once, every trained group once with the demo's exact value: the keys."""
    lines = c.metrics()
    assert [line["step"] for line in lines] == list(range(1, c.config["run"]["total_steps"] + 1))
    seen = Counter(key for line in lines for key in line["groups"])
    assert max(seen.values()) == 1, [k for k, n in seen.items() if n > 1]
    for line in lines:
        for key, value in line["groups"].items():
            assert value == expected_value(int(key[1:])), (key, value)
    assert len(seen) == c.config["run"]["total_steps"] * c.config["pipeline"]["train_batch_groups"]
    return set(seen)


def test_a_poison_group_dies_after_max_attempts_and_nothing_else_does(tmp_path: Path) -> None:
    c = several_per_lease(tmp_path, steps=8)  # its bystanders train before the run ends
    with asyncrl_run(c, {POISON_ENV: POISON}) as proc:
        assert proc.wait(90) == 0, c.log_text("asyncrl-run")[-3000:]
    core, records = journal(c)
    assert dead(core) == {POISON: "generate: worker registered again (attempt 2 of 2)"}
    trained = trained_once(c)
    assert POISON not in trained
    # Its bystanders: the groups leased with it, made suspects by the deaths, not blamed.
    keys = {}
    for added in (x for x in records if isinstance(x, r.Added)):
        keys.update({added.first_gid + i: key for i, key in enumerate(added.keys)})
    poison = next(gid for gid, key in keys.items() if key == POISON)
    leases = [x.gids for x in records if isinstance(x, r.LeaseGranted) and poison in x.gids]
    assert len(leases) == 3  # the first death made it a suspect; two more were counted
    assert len(leases[0]) == 4
    bystanders = {keys[gid] for gids in leases for gid in gids if gid != poison}
    assert bystanders <= trained, bystanders - trained
    # Each death was the supervisor's to repair: three kills, three restarts.
    text = c.log_text("asyncrl-run")
    assert text.count("was ended by SIGKILL") == 3
    assert text.count("started generate-0") == 4
    assert "starts in a row" not in text


def test_random_kills_of_a_worker_holding_several_groups_kill_no_group(tmp_path: Path) -> None:
    c = several_per_lease(tmp_path, steps=22)
    status = c.run_dir / "logs" / "generate-0.status"
    killed: list[int] = []

    def generator_holding_a_lease() -> int | None:
        """The pid of the generator now running, once it is up and holds a lease."""
        fresh = set(processes_mentioning(GENERATOR)) & set(processes_mentioning(str(c.root)))
        fresh -= set(killed)
        if not (fresh and status.exists() and "up" in status.read_text().split()):
            return None
        return min(fresh) if c.status()["leases"].get("generate") else None

    def kill_the_generator() -> None:
        pid = wait_for(generator_holding_a_lease, 30, "a generator holding a lease")
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    def no_suspects() -> bool:
        core, _ = journal(c)
        alive = (g for g in core.state.groups.values() if g.state is not GroupState.DEAD)
        return not any(g.suspects for g in alive)

    with asyncrl_run(c, {"ASYNCRL_DEMO_WORK_S": "generate=0.5"}) as proc:
        # Twice in a row: the second kill hits one of the first one's groups again (all of
        # them, were every death counted against every group held), then once more after
        # the groups it hit were generated.
        kill_the_generator()
        kill_the_generator()
        wait_for(no_suspects, 40, "every suspect generated since")
        kill_the_generator()
        # The scheduler, while the restarted generator holds a lease: renewed, not blamed.
        wait_for(generator_holding_a_lease, 30, "a restarted generator holding a lease")
        scheduler = set(processes_mentioning("asyncrl.runtime.scheduler.cli"))
        scheduler &= set(processes_mentioning(str(c.root)))
        assert len(scheduler) == 1, scheduler
        os.kill(scheduler.pop(), signal.SIGKILL)
        assert proc.wait(90) == 0, c.log_text("asyncrl-run")[-3000:]
    core, records = journal(c)
    assert dead(core) == {}
    trained_once(c)
    # The second kill counted a try against the suspect it hit; no group had two.
    counted = Counter(g for x in records if isinstance(x, r.Failed) and x.counted for g in x.gids)
    assert max(counted.values()) == 1, counted
    text = c.log_text("asyncrl-run")
    assert text.count("was ended by SIGKILL") == 4  # three generators and a scheduler
    assert text.count("started generate-0") == 4
    assert text.count("started scheduler") == 2
    assert '"resumed": true' in (c.run_dir / "logs" / "scheduler.log").read_text()


def test_a_killed_logp_holder_costs_the_reward_leases_nothing(cluster) -> None:
    c: Cluster = cluster(run={"total_steps": 6}, pipeline={"max_staleness": 3})
    c.scheduler()
    for role in ROLES:
        c.worker(role, env={"ASYNCRL_DEMO_WORK_S": "train=1.2,reward=0.3"})

    def logp_waits_and_reward_works() -> bool:
        status = c.status()
        return status["groups"].get("ready", 0) >= 2 and bool(status["leases"].get("reward"))

    wait_for(logp_waits_and_reward_works, 60, "logp payloads unread while reward works")
    c.kill9("logp-0")
    c.worker("logp", 1)
    assert c.wait("scheduler", 90) == 0
    c.check_exactly_once()
    assert c.metrics()[-1]["payloads_regenerated"] >= 1
    log = c.log_text("scheduler")
    assert '"payload lost"' in log and '"role": "logp"' in log and '"holder": "logp-0"' in log
    assert "lease expired" not in log  # no reward lease waited on logp-0 until it ran out
    failed = [line for line in log.splitlines() if '"work failed"' in line]
    assert not [line for line in failed if '"worker": "reward-0"' in line], failed
    assert "carries no logp payload" not in log  # no reward worker was handed one to lose
