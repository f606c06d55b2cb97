"""What a long run costs the scheduler, bounded at a small scale (tests/bench/
scheduler_growth.py measures it at 10^5 groups and 10^6 records).

Memory is what tracemalloc sees the core's objects hold: a count of bytes, not a timing,
so these bounds are not flaky; each leaves about twice the measured value as margin.
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.runtime.scheduler.core.codec import dump_state
from tests.bench.scheduler_growth import (
    footprint,
    known_groups,
    restart,
    trained_run,
    write_journal,
)

GROUPS = 10_000


def test_a_group_the_core_knows_costs_it_under_1_5_kib() -> None:
    # Measured: about 730 bytes a group (a fifth of them leased, half of those generated
    # with a data-plane reference), on CPython 3.11; 1,190 while every group had two
    # empty sets of its own.
    core, used = footprint(lambda: known_groups(GROUPS))
    assert len(core.state.groups) == GROUPS and core.state.leases  # type: ignore[attr-defined]
    assert used.traced / GROUPS < 1536


def test_a_trained_group_leaves_under_300_bytes_behind() -> None:
    # Measured: about 120 bytes a group, mostly its key, kept to refuse it if offered again.
    core, used = footprint(lambda: trained_run(GROUPS))
    assert core.state.steps_done * 16 >= GROUPS - 32  # type: ignore[attr-defined]
    assert len(core.state.groups) < 100  # type: ignore[attr-defined]
    assert used.traced / GROUPS < 300


def test_a_restart_with_a_snapshot_replays_only_the_records_after_it(tmp_path: Path) -> None:
    every = 1_000
    durable = write_journal(tmp_path, 6_000, snapshot_every=every)
    done = restart(tmp_path)
    last = durable.writer.last_seq
    assert done.found.last_seq == last
    # a snapshot follows the commit that reached `every` records since the last one
    assert done.found.snapshot_seq >= last - every - 64
    assert len(done.found.records) <= every + 64
    assert dump_state(done.core.state) == dump_state(durable.core.state)


def test_without_a_snapshot_a_restart_replays_every_record(tmp_path: Path) -> None:
    durable = write_journal(tmp_path, 3_000, snapshot_every=1 << 62)
    done = restart(tmp_path)
    assert done.found.snapshot is None
    assert len(done.found.records) == durable.writer.last_seq
    assert dump_state(done.core.state) == dump_state(durable.core.state)
