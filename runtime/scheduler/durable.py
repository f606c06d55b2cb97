"""The scheduler core made durable: every record it commits goes to the run's journal.

The scheduler process calls a core command, then ``commit()``: the records go to the
journal (fsync'd in batches) and the notices come back to be published. A snapshot is
written every ``snapshot_every`` records so that a restart replays a bounded tail.

The state must not move while a snapshot dumps it, and with a thousand workers it holds
tens of thousands of groups: about 60 ms of dumping and packing, during which the
scheduler answered nobody (the p99 of every request). With ``snapshot_in_child`` (the
scheduler's setting) a forked child dumps the state as it was at the fork while the
scheduler goes on: its pause is the fork, 2 to 11 ms (see ``journal/_child.py``). Where a
fork fails, the snapshot is taken on the caller's thread as before.

Snapshots are also spaced by what they cost (the child's CPU, or the caller's time): the
next one comes no sooner than its predecessor's cost divided by ``SNAPSHOT_SHARE``,
unless ``SNAPSHOT_CAP`` times ``snapshot_every`` records went by, which keeps a restart's
replay bounded all the same. A small state's snapshot takes a millisecond, so for it the
record count alone decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from asyncrl.runtime.contract.logs import get_logger
from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Pipeline
from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state
from asyncrl.runtime.scheduler.core.effects import Notice
from asyncrl.runtime.scheduler.journal import JournalWriter, Replay, replay

log = get_logger("asyncrl.scheduler")

__all__ = [
    "RETRY_AFTER_FAILURE_S",
    "SNAPSHOT_CAP",
    "SNAPSHOT_SHARE",
    "JournalExists",
    "JournaledCore",
    "recover",
]

# At most 0.2% of the wall time in snapshots: at 1,024 workers one takes 40-60 ms (18,500
# groups), on the scheduler's thread where a fork fails and of a core's time where not.
SNAPSHOT_SHARE = 0.002
# ... but never more than this many times snapshot_every records between two (replay
# runs about 50,000 records a second here: 100,000 records, 2 s of restart).
SNAPSHOT_CAP = 10
# After a child failed (a full disk, say), none sooner than this, cap or not: a child that
# fails at once must not be forked again on every request.
RETRY_AFTER_FAILURE_S = 10.0


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
        snapshot_in_child: bool = False,
    ) -> None:
        self.core = core
        self.writer = writer
        self._clock = clock
        self._in_child = snapshot_in_child
        self._next_snapshot_at = 0.0  # the cost rule's earliest time for the next one
        self._child_began = 0.0
        self._retry_at = 0.0  # after a failed child, no snapshot before this
        self.snapshots_started = 0  # so a caller can tell which of its turns began one

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
        snapshot_in_child: bool = False,
    ) -> JournaledCore:
        """Start a run's core afresh, or with ``resume`` from its journal. With
        ``snapshot_in_child`` snapshots are dumped by a forked child (the module doc)."""
        found = replay(directory)
        if found.last_seq and not resume:
            raise JournalExists(
                f"{directory} already holds a journal ({found.last_seq} records); "
                "resume it with --resume or choose another run.dir"
            )
        core = SchedulerCore.restore(settings, found.records, pipeline, found.snapshot)
        durable = cls(core, writer_factory(directory), clock, snapshot_in_child)
        if resume:
            core.resume(now)
            durable.commit()  # a snapshot must never run ahead of the journal
        if found.bad_snapshots:
            durable.snapshot()  # so cleanup can never delete the last good one
        return durable

    def commit(self) -> list[Notice]:
        """Journal what the core decided since the last commit; return what to publish."""
        if self.writer.snapshot_in_flight:
            self._reap(wait=False)
        records, notices = self.core.drain()
        if records:
            self.writer.append_many(records)
            if self._snapshot_due():
                self.snapshot()
        return notices

    def _snapshot_due(self) -> bool:
        writer = self.writer
        if not writer.needs_snapshot or writer.snapshot_in_flight:
            return False
        if self._retry_at and self._clock() < self._retry_at:
            return False
        overdue = writer.records_since_snapshot >= SNAPSHOT_CAP * writer.snapshot_every
        return overdue or self._clock() >= self._next_snapshot_at

    def snapshot(self) -> None:
        """Snapshot the state as of the last journaled record (call right after a commit):
        in a forked child with ``snapshot_in_child``, else here."""
        began = self._clock()
        self.snapshots_started += 1
        if self._in_child:
            try:
                self.writer.snapshot_in_child(lambda: dump_state(self.core.state))
                self._child_began = began
                return
            except OSError as error:
                log.warning("snapshot taken in the scheduler: fork failed", error=str(error))
        self.writer.write_snapshot(dump_state(self.core.state), self.writer.last_seq)
        self._next_snapshot_at = began + (self._clock() - began) / SNAPSHOT_SHARE

    def _reap(self, *, wait: bool) -> None:
        outcome = self.writer.poll_snapshot(wait=wait)
        if outcome is None:
            return
        self._next_snapshot_at = self._child_began + outcome.cpu_s / SNAPSHOT_SHARE
        if not outcome.ok:  # the journal holds every record: only replay grows meanwhile
            self._retry_at = self._clock() + RETRY_AFTER_FAILURE_S
            log.warning(f"snapshot failed; the next in {RETRY_AFTER_FAILURE_S:g} s at the "
                        "soonest", reason=outcome.error)  # fmt: skip

    def close(self) -> None:
        self.commit()
        if self.writer.snapshot_in_flight:
            self._reap(wait=True)
        self.writer.close()
