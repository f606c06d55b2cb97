"""The core's indexes: each matches a plain scan of the state after random operations, and
heartbeats, claims, completions and ticks never scan the tables that grow with the
worker count or the run.

Indexes (runtime/scheduler/core/indexes.py, liveness.py): leases by worker and by role, suspected
groups per state, the lease expiry heap, the takeable-group heaps, and the workers'
silence deadlines. The property machine checks the same after every step
(tests/property/core_machine.py); here many more workers and a restart from a snapshot.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state
from asyncrl.runtime.scheduler.core.effects import Grant, Rejected, WorkerLost
from tests.support.core_indexes import index_mismatches

ROLES = ("generate", "logp", "ref_logp", "reward", "train")
SETTINGS = CoreSettings(
    max_staleness=2, train_batch_groups=2, max_attempts=3, lease_timeout=10.0, worker_timeout=6.0
)


class Driver:
    """Random registrations, heartbeats, claims, completions, failures, deaths and ticks."""

    def __init__(self, seed: int, workers: int) -> None:
        self.rng = random.Random(seed)
        self.core = SchedulerCore(SETTINGS)
        self.journal: list[Any] = []
        self.now = 0.0
        self.names = [f"{ROLES[i % len(ROLES)]}-{i}" for i in range(workers)]
        self.held: dict[int, tuple[int, tuple[int, ...], str]] = {}  # lid -> fence, gids, role
        self.keys = 0
        self.lost = 0  # workers lost to silence
        for name in self.names:
            self.register(name)

    def role(self, name: str) -> str:
        return name.rpartition("-")[0]

    def register(self, name: str) -> None:
        self.core.register(name, self.role(name), self.now)
        if self.role(name) == "generate":
            self.core.loaded_version(name, self.core.state.policy_version)

    def step(self) -> None:
        rng, core, now = self.rng, self.core, self.now
        name = rng.choice(self.names)
        op = rng.random()
        if op < 0.1:
            core.add_groups([f"k{self.keys + i}" for i in range(4)])
            self.keys += 4
        elif op < 0.4:
            reply = core.claim(self.role(name), name, rng.randint(1, 3), now)
            if isinstance(reply, Grant):
                self.held[reply.lease_id] = (reply.fence, reply.groups, reply.role)
        elif op < 0.6 and self.held:
            lid = rng.choice(sorted(self.held))
            fence, gids, role = self.held.pop(lid)
            behaviour = [(0, 0)] * len(gids) if role == "generate" else None
            if rng.random() < 0.8:
                core.complete(lid, fence, gids, behaviour)
            else:
                core.fail(lid, fence, None, "it raised")
        elif op < 0.75:
            core.heartbeat(name, now)
        elif op < 0.8:
            self.register(name)  # a new process: the old one died holding its work
        elif op < 0.83:
            core.worker_lost(name, "left", died=False)
            self.register(name)
        elif op < 0.86 and core.state.steps_done > core.state.policy_version:
            trainer = next(n for n in self.names if self.role(n) == "train")
            core.publish_version(trainer, core.state.steps_done)
        else:
            for other in self.names:  # most workers heartbeat in time, a few fall silent
                if rng.random() < 0.9:
                    core.heartbeat(other, now)
            self.now += rng.choice((0.5, 1.0, 3.0))
            core.tick(self.now)
            for name in self.names:  # workers lost to silence come back
                if name not in core.state.workers:
                    self.register(name)
        records, notices = core.drain()
        self.journal.extend(records)
        self.lost += sum(1 for notice in notices if isinstance(notice, WorkerLost))


@pytest.mark.parametrize("seed", range(6))
def test_every_index_matches_a_scan_after_random_operations(seed: int) -> None:
    driver = Driver(seed, workers=24)
    snapshot: tuple[dict[str, Any], int] | None = None
    seen = {"leases": 0, "suspected": 0, "lost": 0, "steps": 0}
    for i in range(600):
        driver.step()
        assert index_mismatches(driver.core, driver.now) == [], f"after operation {i}"
        if i % 150 == 75:
            snapshot = (dump_state(driver.core.state), len(driver.journal))
        state = driver.core.state
        seen["leases"] = max(seen["leases"], len(state.leases))
        seen["suspected"] = max(seen["suspected"], sum(state.indexes.suspected.values()))
        seen["lost"] = driver.lost
        seen["steps"] = state.steps_done
    assert all(seen.values()), seen  # the operations reached every index
    assert snapshot is not None
    state, upto = snapshot
    for restored in (
        SchedulerCore.restore(SETTINGS, driver.journal),
        SchedulerCore.restore(SETTINGS, driver.journal[upto:], snapshot=state),
    ):
        assert dump_state(restored.state) == dump_state(driver.core.state)
        restored.resume(driver.now)
        assert index_mismatches(restored, driver.now) == []


class NoScan(dict):
    """A table that refuses to be walked: lookups only."""

    def _refuse(self, *_: Any) -> Iterator[Any]:
        raise AssertionError("a scan of a table that grows with the run")

    __iter__ = values = items = keys = _refuse  # type: ignore[assignment]


def test_heartbeats_claims_completions_and_ticks_scan_no_table() -> None:
    driver = Driver(0, workers=64)
    core, state = driver.core, driver.core.state
    core.add_groups([f"g{i}" for i in range(16)])
    state.leases, state.groups, state.workers = (
        NoScan(state.leases),
        NoScan(state.groups),
        NoScan(state.workers),
    )
    core.last_seen._seen = NoScan(core.last_seen._seen)
    granted: set[str] = set()
    for now in range(1, 7):  # each round: every worker heartbeats and claims, then a tick
        for name in driver.names:
            assert not isinstance(core.heartbeat(name, float(now)), Rejected)
            reply = core.claim(driver.role(name), name, 2, float(now))
            if isinstance(reply, Grant):
                granted.add(reply.role)
                behaviour = [(0, 0)] * len(reply.groups) if reply.role == "generate" else None
                core.complete(reply.lease_id, reply.fence, reply.groups, behaviour)
        core.tick(float(now))
    assert granted == set(ROLES)
    assert state.steps_done > 0
