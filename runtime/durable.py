"""The scheduler core made durable: every record it commits goes to the run's journal.

The scheduler process calls a core command, then ``commit()``: the records go to the
journal (fsync'd in batches) and the notices come back to be published. A snapshot is
written every ``snapshot_every`` records so that a restart replays a bounded tail.

A snapshot is taken on the scheduler's own thread (the state must not move while it is
dumped), and every request waiting meanwhile waits for it: with a thousand workers the
state holds tens of thousands of groups and a snapshot takes tens of milliseconds. So
snapshots are also spaced by what they cost: the next one comes no sooner than its
predecessor's duration divided by ``SNAPSHOT_SHARE`` (the most of the wall time they may
take), unless ``SNAPSHOT_CAP`` times ``snapshot_every`` records went by, which keeps a
restart's replay bounded all the same. A small state's snapshot takes a millisecond, so
for it the record count alone decides, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.runtime.core import CoreSettings, SchedulerCore
from asyncrl.runtime.core.codec import dump_state
from asyncrl.runtime.core.effects import Notice
from asyncrl.runtime.core.pipeline import DEFAULT_PIPELINE, Pipeline
from asyncrl.runtime.journal import JournalWriter, Replay, replay

__all__ = ["SNAPSHOT_CAP", "SNAPSHOT_SHARE", "JournalExists", "JournaledCore", "recover"]

# At most 0.2% of the wall time in snapshots: at 1,024 workers one took 40-50 ms (18,500
# groups), and a stall that long every few seconds was the p99 of every request.
SNAPSHOT_SHARE = 0.002
# ... but never more than this many times snapshot_every records between two (replay
# runs about 50,000 records a second here: 100,000 records, 2 s of restart).
SNAPSHOT_CAP = 10


class JournalExists(FileExistsError):
    """A fresh start would append to an old run's journal."""


def recover(
    directory: Path, settings: CoreSettings, pipeline: Pipeline = DEFAULT_PIPELINE
) -> tuple[SchedulerCore, Replay]:
    """Rebuild the core from the journal in ``directory`` (read-only)."""
    found = replay(directory)
    core = SchedulerCore.restore(settings, found.records, pipeline, found.snapshot)
    return core, found


class JournaledCore:
    def __init__(
        self,
        core: SchedulerCore,
        writer: JournalWriter,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.core = core
        self.writer = writer
        self._clock = clock
        self._next_snapshot_at = 0.0  # the cost rule's earliest time for the next one

    @classmethod
    def open(
        cls,
        directory: Path,
        settings: CoreSettings,
        *,
        resume: bool,
        now: float,
        pipeline: Pipeline = DEFAULT_PIPELINE,
        writer_factory: Callable[[Path], JournalWriter] = JournalWriter.open,
        clock: Callable[[], float] = time.perf_counter,
    ) -> JournaledCore:
        """Start a run's core afresh, or with ``resume`` from its journal."""
        found = replay(directory)
        if found.last_seq and not resume:
            raise JournalExists(
                f"{directory} already holds a journal ({found.last_seq} records); "
                "resume it with --resume or choose another run.dir"
            )
        core = SchedulerCore.restore(settings, found.records, pipeline, found.snapshot)
        durable = cls(core, writer_factory(directory), clock)
        if resume:
            core.resume(now)
            durable.commit()  # a snapshot must never run ahead of the journal
        if found.bad_snapshots:
            durable.snapshot()  # so cleanup can never delete the last good one
        return durable

    def commit(self) -> list[Notice]:
        """Journal what the core decided since the last commit; return what to publish."""
        records, notices = self.core.drain()
        if records:
            self.writer.append_many(records)
            if self._snapshot_due():
                self.snapshot()
        return notices

    def _snapshot_due(self) -> bool:
        writer = self.writer
        if not writer.needs_snapshot:
            return False
        overdue = writer.records_since_snapshot >= SNAPSHOT_CAP * writer.snapshot_every
        return overdue or self._clock() >= self._next_snapshot_at

    def snapshot(self) -> None:
        """Write the state as of the last journaled record (call right after a commit)."""
        began = self._clock()
        self.writer.write_snapshot(dump_state(self.core.state), self.writer.last_seq)
        self._next_snapshot_at = began + (self._clock() - began) / SNAPSHOT_SHARE

    def close(self) -> None:
        self.commit()
        self.writer.close()
