"""The scheduler core made durable: every record it commits goes to the run's journal.

The scheduler process calls a core command, then ``commit()``: the records go to the
journal (fsync'd in batches) and the notices come back to be published. A snapshot is
written every ``snapshot_every`` records so that a restart replays a bounded tail.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from asyncrl.runtime.core import CoreSettings, SchedulerCore
from asyncrl.runtime.core.codec import dump_state
from asyncrl.runtime.core.effects import Notice
from asyncrl.runtime.core.pipeline import DEFAULT_PIPELINE, Pipeline
from asyncrl.runtime.journal import JournalWriter, Replay, replay

__all__ = ["JournalExists", "JournaledCore", "recover"]


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
    def __init__(self, core: SchedulerCore, writer: JournalWriter) -> None:
        self.core = core
        self.writer = writer

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
    ) -> JournaledCore:
        """Start a run's core afresh, or with ``resume`` from its journal."""
        found = replay(directory)
        if found.last_seq and not resume:
            raise JournalExists(
                f"{directory} already holds a journal ({found.last_seq} records); "
                "resume it with --resume or choose another run.dir"
            )
        core = SchedulerCore.restore(settings, found.records, pipeline, found.snapshot)
        durable = cls(core, writer_factory(directory))
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
            if self.writer.needs_snapshot:
                self.snapshot()
        return notices

    def snapshot(self) -> None:
        """Write the state as of the last journaled record (call right after a commit)."""
        self.writer.write_snapshot(dump_state(self.core.state), self.writer.last_seq)

    def close(self) -> None:
        self.commit()
        self.writer.close()
