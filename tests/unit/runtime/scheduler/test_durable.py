"""The core with its journal on disk: restarts, cut files, and the refusal to clobber a run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state
from asyncrl.runtime.scheduler.core.journal_records import Op
from asyncrl.runtime.scheduler.durable import (
    SNAPSHOT_CAP,
    SNAPSHOT_SHARE,
    JournaledCore,
    JournalExists,
    recover,
)
from asyncrl.runtime.scheduler.journal import JournalWriter, replay
from tests.support.pipeline_driver import Sim

SETTINGS = CoreSettings(max_staleness=1, train_batch_groups=4, max_attempts=3)


def writer(**options: int):
    return lambda path: JournalWriter.open(path, **options)


def run_journaled(directory: Path, steps: int, **options: int) -> tuple[JournaledCore, list]:
    """A short busy run; returns the durable core and every record it journaled, in order."""
    # On a stopped clock a snapshot costs nothing: the record count alone spaces them.
    durable = JournaledCore.open(
        directory,
        SETTINGS,
        resume=False,
        now=0.0,
        writer_factory=writer(**options),
        clock=lambda: 0.0,
    )
    records: list = []
    commit = durable.commit

    def keep() -> list:
        records.extend(durable.core._records)  # what commit is about to journal
        return commit()

    sim = Sim(durable.core, keep, groups=10_000)
    sim.start()
    for _ in range(steps):
        sim.step()
    keep()
    return durable, records


def test_restart_rebuilds_the_live_state(tmp_path: Path) -> None:
    durable, _ = run_journaled(tmp_path, steps=60, snapshot_every=50)
    live = dump_state(durable.core.state)
    durable.close()
    core, found = recover(tmp_path, SETTINGS)
    assert found.snapshot is not None, "snapshots keep replay bounded"
    assert len(found.records) < 50 * 2
    assert dump_state(core.state) == live


def test_a_costly_snapshot_spaces_the_next_by_its_cost_up_to_the_record_cap(
    tmp_path: Path,
) -> None:
    now = [0.0]
    durable = JournaledCore.open(
        tmp_path,
        SETTINGS,
        resume=False,
        now=0.0,
        writer_factory=writer(snapshot_every=20),
        clock=lambda: now[0],
    )
    writer_ = durable.writer
    write_snapshot = writer_.write_snapshot

    def slow_snapshot(*args, **kwargs):  # each snapshot takes 50 ms of the scheduler's time
        now[0] += 0.05
        return write_snapshot(*args, **kwargs)

    writer_.write_snapshot = slow_snapshot  # type: ignore[method-assign]
    sim = Sim(durable.core, durable.commit, groups=10_000)
    sim.start()
    while writer_.snapshots_written == 0:
        sim.step()
    spacing = 0.05 / SNAPSHOT_SHARE  # the next one waits this long after the first began
    # Past snapshot_every records but not the cap: none while the cost rule says wait.
    while writer_.records_since_snapshot < 3 * 20:
        sim.step()
    assert writer_.snapshots_written == 1
    # The cap: replay stays bounded however long the cost rule would wait.
    while writer_.snapshots_written == 1:
        assert writer_.records_since_snapshot < SNAPSHOT_CAP * 20 + 50, "no snapshot at the cap"
        sim.step()
    assert now[0] < spacing
    # Once the time has come, the record count decides again.
    now[0] += spacing
    while writer_.records_since_snapshot < 20:
        sim.step()
    durable.commit()
    assert writer_.snapshots_written == 3
    durable.close()


def test_a_journal_cut_at_any_byte_replays_to_a_prefix_of_the_run(tmp_path: Path) -> None:
    durable, records = run_journaled(tmp_path, steps=25, fsync_every=1)
    durable.close()
    segment = next(tmp_path.glob("journal-*.log"))
    whole = segment.read_bytes()
    rng = random.Random(7)
    for cut in [*sorted(rng.sample(range(len(whole)), 40)), 0, len(whole)]:
        segment.write_bytes(whole[:cut])
        core, found = recover(tmp_path, SETTINGS)
        prefix = SchedulerCore.restore(SETTINGS, records[: found.last_seq])
        assert dump_state(core.state) == dump_state(prefix.state), f"cut at byte {cut}"
        counts = core.state.counts
        assert sum(counts.values()) == core.state.next_gid  # a valid state: nothing lost
    segment.write_bytes(whole)


def test_a_cut_journal_resumes_and_keeps_going(tmp_path: Path) -> None:
    durable, records = run_journaled(tmp_path, steps=20)
    durable.close()
    segment = next(tmp_path.glob("journal-*.log"))
    segment.write_bytes(segment.read_bytes()[:-3])  # torn last record
    assert replay(tmp_path).last_seq == len(records) - 1
    resumed = JournaledCore.open(tmp_path, SETTINGS, resume=True, now=100.0)
    resumed.writer.flush()
    assert replay(tmp_path).records[len(records) - 1][0] == Op.RESUME  # journaled at once
    sim = Sim(resumed.core, resumed.commit, groups=10_000)
    sim.now = 100.0
    for _ in range(10):
        sim.step()
    resumed.close()
    assert replay(tmp_path).last_seq > len(records)


def test_a_fresh_start_refuses_an_old_journal(tmp_path: Path) -> None:
    durable, _ = run_journaled(tmp_path, steps=2)
    durable.close()
    with pytest.raises(JournalExists, match="--resume"):
        JournaledCore.open(tmp_path, SETTINGS, resume=False, now=0.0)
