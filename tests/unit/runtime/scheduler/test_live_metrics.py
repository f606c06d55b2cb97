"""/metrics without a socket: what a scrape of the service's snapshot holds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from asyncrl.transport import protocol as p
from tests.unit.runtime.scheduler.test_service import make, one_step

pytest.importorskip("prometheus_client", reason="the metrics extra is not installed")

from asyncrl.runtime.scheduler.service.live_metrics import LiveMetrics


def _samples(live: LiveMetrics) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in live.collect()
        for s in family.samples
    }


def test_a_scrape_reads_the_snapshot_the_loop_took(tmp_path: Path) -> None:
    service = make(tmp_path, total_steps=3)
    live = LiveMetrics(service, every_s=1.0)
    assert list(live.collect()) == []  # nothing before the loop's first snapshot
    one_step(service, "a")
    live.refresh(10.0)
    m = _samples(live)
    assert m[("asyncrl_steps_done", ())] == 1 and m[("asyncrl_total_steps", ())] == 3
    assert m[("asyncrl_groups", (("state", "trained"),))] == 1
    assert m[("asyncrl_groups", (("state", "pending"),))] == 0
    assert m[("asyncrl_workers", (("role", "train"),))] == 1
    assert m[("asyncrl_leases", (("role", "generate"),))] == 0
    assert m[("asyncrl_lease_expiries_total", ())] == 0
    service.handle(p.AddGroups("dataloader", (p.NewGroup("b", {"x": 1}),)), 10.0)
    live.refresh(10.5)  # within every_s: the snapshot stays
    assert _samples(live)[("asyncrl_groups", (("state", "pending"),))] == 0
    live.refresh(11.0)
    assert _samples(live)[("asyncrl_groups", (("state", "pending"),))] == 1


def test_a_snapshot_of_many_groups_costs_the_loop_little(tmp_path: Path) -> None:
    service = make(tmp_path, total_steps=10_000)
    groups = tuple(p.NewGroup(f"g{i}", {"x": i}) for i in range(20_000))
    service.plan.backlog = len(groups)
    start = time.perf_counter()
    service.handle(p.AddGroups("dataloader", groups), 0.0)
    added = time.perf_counter() - start
    live = LiveMetrics(service, every_s=1.0)
    took = []
    for second in range(5):  # the quickest of five: a busy machine's pauses left out
        start = time.perf_counter()
        live.refresh(1.0 + second)
        took.append(time.perf_counter() - start)
    assert _samples(live)[("asyncrl_groups", (("state", "pending"),))] == 20_000
    # Against the loop's own work on the same machine, not a number of seconds (which says
    # more of the machine than of the code): a snapshot of 20,000 groups costs under a
    # tenth of what taking them in did (2.3 ms against 0.36 s here on 2026-11-28).
    assert min(took) < added / 10, (took, added)
