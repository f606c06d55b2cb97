"""Appending to a journal: :class:`JournalWriter`, its batching, snapshots and cleanup."""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import msgpack

from asyncrl.runtime.contract.whole_dirs import fsync_directory

from ._child import ChildOutcome, SnapshotChild
from ._files import (
    OPEN_FLAGS,
    Layout,
    SnapshotSlot,
    lock,
    obsolete_files,
    pack_snapshot,
    publish_snapshot,
    recover,
    retire,
    snapshot_temp,
    store_snapshot,
    unlink_snapshot_temp,
)
from ._format import HEADER, MAX_RECORD_BYTES, PathLike, segment_name
from ._syncer import BackgroundSyncer, InlineSyncer


@dataclass(frozen=True, slots=True)
class JournalStats:
    """Counters for one writer since it was opened.

    ``bytes_written`` counts record frame bytes (header included), buffered ones too;
    ``fsyncs`` counts fsyncs of segment data (not of snapshots or the directory) and
    ``fsync_seconds`` the time spent in them, on whichever thread ran them. On the syncer
    thread that time also holds the wait to get the GIL back after each fsync (up to
    ``sys.getswitchinterval()``, 5 ms by default), so it reads high on a busy interpreter.
    """

    records: int
    bytes_written: int
    fsyncs: int
    snapshots: int
    snapshot_bytes: int
    fsync_seconds: float = 0.0


def _closed(_obj: object) -> NoReturn:
    raise ValueError("journal writer is closed")


def _check_options(fsync_every: int, fsync_interval_s: float, snapshot_every: int) -> None:
    if fsync_every < 1 or snapshot_every < 1 or fsync_interval_s < 0:
        raise ValueError("fsync_every and snapshot_every must be >= 1, fsync_interval_s >= 0")


class JournalWriter:
    """Appends records to a journal directory; the only writer of that directory.

    Records are framed into an in-memory buffer. Once ``fsync_every`` records are pending or
    ``fsync_interval_s`` has passed since the first pending one (checked on each append; call
    :meth:`flush_if_due` from an idle timer), the batch is written and fsynced. With
    ``background_fsync`` (the default) the call that made the batch due writes it (a copy
    into the page cache, so :attr:`written_seq` covers it when the call returns) and a log
    thread fsyncs it, the appending thread going on at once; only right after a snapshot,
    until the log thread has done the snapshot's disk work, are batches written there too.
    :attr:`durable_seq` says how far the disk has caught up and :meth:`flush` waits for it.
    A caller that must not acknowledge anything before it is on disk (the scheduler's
    replies) waits until ``durable_seq`` covers it. Without background_fsync, the write and
    fsync run inside the call that made the batch due.

    A crash may lose records not yet fsynced; it never loses or damages earlier ones. An
    ``OSError`` from a background fsync is raised by the next :meth:`append`, :meth:`flush`,
    :meth:`flush_if_due` or :meth:`close`, and again by every later one: after an ``OSError``
    the writer must be discarded; reopening the directory recovers it.

    Only one thread may call a writer. Build one with :meth:`open`.
    """

    def __init__(
        self,
        root: Path,
        lock_fd: int,
        layout: Layout,
        *,
        fsync_every: int,
        fsync_interval_s: float,
        snapshot_every: int,
        clock: Callable[[], float],
        background_fsync: bool = True,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self._root = root
        self._lock_fd = lock_fd
        self._fsync_every = fsync_every
        self._fsync_interval_s = fsync_interval_s
        self._snapshot_every = snapshot_every
        self._clock = clock
        self._pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
        self._buf = bytearray()
        self._pending = 0  # records appended since the last hand-off to the OS
        self._unsynced = 0  # records handed off since the last hand-off fsynced at once
        self._first_pending_at = 0.0
        self._segments = list(layout.segments)
        self._snapshots = list(layout.snapshots)
        self._seq = self._opened_at_seq = layout.last_seq
        self._fd = -1
        self._segment_first = 0
        self._flushed_bytes = self._snapshot_bytes = self._snapshots_written = 0
        self._in_child: tuple[SnapshotSlot, SnapshotChild] | None = None  # a snapshot being written
        # Everything found at open is on disk: recovery fsynced the tail, snapshots are fsynced.
        self._syncer = (
            BackgroundSyncer(layout.last_seq, f"journal-fsync:{root}", on_progress)
            if background_fsync
            else InlineSyncer(layout.last_seq)
        )
        try:
            self._open_tail(layout.tail_next)
        except BaseException:
            self._syncer.close()
            raise

    @classmethod
    def open(
        cls,
        directory: PathLike,
        *,
        fsync_every: int = 256,
        fsync_interval_s: float = 0.05,
        snapshot_every: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        background_fsync: bool = True,
        on_progress: Callable[[], None] | None = None,
    ) -> JournalWriter:
        """Open (creating if needed) a journal directory for appending after its last record.

        ``on_progress`` is called from the log thread after each fsync, and after each batch
        the log thread writes itself (a server uses it to wake the loop that holds replies).

        Raises :class:`JournalLocked` if another writer holds it and :class:`JournalCorrupt`
        if its last segment is damaged beyond a torn tail.
        """
        _check_options(fsync_every, fsync_interval_s, snapshot_every)
        root = Path(directory)
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_fd = lock(root)
        try:
            layout = recover(root)
            return cls(
                root,
                lock_fd,
                layout,
                fsync_every=fsync_every,
                fsync_interval_s=fsync_interval_s,
                snapshot_every=snapshot_every,
                clock=clock,
                background_fsync=background_fsync,
                on_progress=on_progress,
            )
        except BaseException:
            os.close(lock_fd)
            raise

    # ------------------------------------------------------------------ hot path

    def append(self, record: Any) -> int:
        """Append one record and return its seq."""
        failed = self._syncer.error
        if failed is not None:
            raise failed
        seq = self._seq + 1
        payload = self._pack([seq, record])
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"record of {len(payload)} bytes exceeds {MAX_RECORD_BYTES}")
        buf = self._buf
        buf += HEADER.pack(len(payload), zlib.crc32(payload))
        buf += payload
        self._seq = seq
        self._pending += 1
        if self._pending == 1:
            self._first_pending_at = self._clock()
        if (
            self._pending >= self._fsync_every
            or self._clock() - self._first_pending_at >= self._fsync_interval_s
        ):
            self._hand_off()
        return seq

    def append_many(self, records: Iterable[Any]) -> int:
        """Append records in order; returns the last seq (unchanged if ``records`` is empty)."""
        append = self.append
        for record in records:
            append(record)
        return self._seq

    def _hand_off(self, fsync_within: float = 0.0) -> None:
        """Give the buffered records to the syncer, to be written and fsynced (the fsync
        within ``fsync_within`` seconds, or at once once a batch's worth is unsynced)."""
        batch, self._buf = self._buf, bytearray()
        self._flushed_bytes += len(batch)
        self._unsynced += self._pending
        self._pending = 0
        if self._unsynced >= self._fsync_every:
            fsync_within = 0.0
        if not fsync_within:
            self._unsynced = 0
        self._syncer.request(self._fd, self._seq, batch, fsync_within)

    def submit(self, *, durable: bool = True) -> None:
        """Hand buffered records to the disk now, without waiting (a reply is held on them):
        usually they are written when this returns (see the class doc).

        With ``durable`` the fsync follows at once. Without it (a reply that waits only for
        the write) the fsync keeps to the batching rule, ``fsync_interval_s`` after the
        oldest record or once ``fsync_every`` are unsynced, so that one fsync covers the
        writes of many turns instead of the log thread fsyncing (and waking) for each.
        """
        failed = self._syncer.error
        if failed is not None:
            raise failed
        if self._pending:
            due_in = self._first_pending_at + self._fsync_interval_s - self._clock()
            self._hand_off(0.0 if durable else max(0.0, due_in))

    def flush(self) -> None:
        """Write buffered records and return once everything appended so far is fsynced."""
        self._check_open()
        if self._pending:
            self._hand_off()
        self._syncer.barrier()

    def flush_if_due(self) -> bool:
        """Hand the batch off if its oldest record has waited ``fsync_interval_s``.

        For idle timers. Unlike :meth:`flush` it does not wait for a background fsync.
        """
        failed = self._syncer.error
        if failed is not None:
            raise failed
        due = bool(self._pending) and (
            self._clock() - self._first_pending_at >= self._fsync_interval_s
        )
        if due:
            self._hand_off()
        return due

    # ------------------------------------------------------------------ snapshots

    @property
    def snapshots_written(self) -> int:
        """Snapshots written since this writer opened (cheap, unlike :meth:`stats`)."""
        return self._snapshots_written

    @property
    def records_since_snapshot(self) -> int:
        """Records appended after the newest snapshot (what a restart replays)."""
        return self._seq - (self._snapshots[-1] if self._snapshots else 0)

    @property
    def snapshot_every(self) -> int:
        return self._snapshot_every

    @property
    def needs_snapshot(self) -> bool:
        """True once ``snapshot_every`` records were appended since the newest snapshot."""
        return self.records_since_snapshot >= self._snapshot_every

    def write_snapshot(self, state: dict[Any, Any], seq: int | None = None) -> int:
        """Store ``state`` as the state after record ``seq`` (default: the last one).

        Then starts a new segment and deletes files no longer needed for replay. With a
        background syncer the disk work happens there, in order after the records up to
        ``seq``, and this returns once ``state`` is packed (``flush`` waits for all of it).
        Returns seq.
        """
        seq = self._seq if seq is None else seq
        self._check_snapshot_seq(seq)
        frame = pack_snapshot(seq, state)
        slot = self._begin_snapshot(seq)
        self._finish_snapshot(slot, partial(store_snapshot, self._root, seq, frame), len(frame))
        return seq

    def snapshot_in_child(self, make_state: Callable[[], dict[Any, Any]]) -> None:
        """Start a snapshot of the state after the last record, dumped in a forked child.

        ``make_state`` runs in the child, on the memory as it was at the fork: call this
        right after appending the records that bring the journal to that state. The child
        writes the snapshot's temp file; :meth:`poll_snapshot` puts it in place once the
        child has ended. Raises ``OSError`` if the fork fails (nothing is changed then).
        """
        seq = self._seq
        self._check_snapshot_seq(seq)
        slot = self._begin_snapshot(seq)
        try:
            child = SnapshotChild.start(
                self._root, seq, lambda: pack_snapshot(seq, make_state()), (self._lock_fd,)
            )
        except OSError:
            self._abandon_snapshot(slot)
            raise
        self._in_child = (slot, child)

    @property
    def snapshot_in_flight(self) -> bool:
        """A child is writing a snapshot (no other snapshot may start until it has ended)."""
        return self._in_child is not None

    def poll_snapshot(self, *, wait: bool = False) -> ChildOutcome | None:
        """Once the child has ended (``wait``: wait for it), put its snapshot in place as
        :meth:`write_snapshot` does, or drop what a failed one left. None while it runs."""
        if self._in_child is None:
            return None
        slot, child = self._in_child
        outcome = child.wait() if wait else child.poll()
        if outcome is None:
            return None
        self._in_child = None
        if outcome.ok:
            size = snapshot_temp(self._root, slot.seq).stat().st_size
            self._finish_snapshot(slot, partial(publish_snapshot, self._root, slot.seq), size)
        else:
            self._abandon_snapshot(slot)
        return outcome

    def _check_snapshot_seq(self, seq: int) -> None:
        if self._in_child is not None:
            raise ValueError("a snapshot is being written by a child; poll_snapshot first")
        newest = self._snapshots[-1] if self._snapshots else 0
        if not newest < seq <= self._seq:
            raise ValueError(f"snapshot seq must be in ({newest}, {self._seq}], got {seq}")

    def _begin_snapshot(self, seq: int) -> SnapshotSlot:
        """The records a snapshot claims to follow go to disk first; later ones go to a
        new segment."""
        if self._pending:
            self._hand_off()
        old_fd = -1
        if self._segment_first <= self._seq:
            old_fd, self._fd = self._fd, self._new_segment(self._seq + 1)
        return SnapshotSlot(seq, old_fd)

    def _finish_snapshot(self, slot: SnapshotSlot, store: Callable[[], None], size: int) -> None:
        self._snapshots.append(slot.seq)
        doomed = obsolete_files(self._root, self._snapshots, self._segments)
        self._syncer.run(partial(retire, store, slot.old_fd, doomed))
        self._snapshot_bytes += size
        self._snapshots_written += 1

    def _abandon_snapshot(self, slot: SnapshotSlot) -> None:
        """Its temp file goes; the segment started for it stays (replay reads across)."""
        drop = partial(unlink_snapshot_temp, self._root, slot.seq)
        self._syncer.run(partial(retire, drop, slot.old_fd, []))

    def _open_tail(self, tail_next: int | None) -> None:
        """Append to the last segment, unless it does not end right before the next seq."""
        if tail_next != self._seq + 1:
            # No segment yet, or the newest snapshot is past the last segment's records.
            self._start_segment(self._seq + 1)
            return
        self._segment_first = self._segments[-1]
        self._fd = os.open(self._root / segment_name(self._segment_first), OPEN_FLAGS, 0o600)

    def _start_segment(self, first_seq: int) -> None:
        """The first segment of a directory, made durable by name before any record."""
        self._fd = self._new_segment(first_seq)
        fsync_directory(self._root)

    def _new_segment(self, first_seq: int) -> int:
        fd = os.open(self._root / segment_name(first_seq), OPEN_FLAGS, 0o600)
        self._segments.append(first_seq)
        self._segment_first = first_seq
        return fd

    # ------------------------------------------------------------------ lifecycle

    @property
    def directory(self) -> Path:
        return self._root

    @property
    def last_seq(self) -> int:
        """Seq of the last appended record (0 for an empty journal)."""
        return self._seq

    @property
    def durable_seq(self) -> int:
        """Seq of the last record known to be fsynced; lags :attr:`last_seq` until a flush."""
        return self._syncer.counters()[2]

    @property
    def written_seq(self) -> int:
        """Seq of the last record handed to the OS: safe from a crash of this process."""
        return self._syncer.written_seq()

    @property
    def stats(self) -> JournalStats:
        fsyncs, fsync_seconds, _ = self._syncer.counters()
        return JournalStats(
            records=self._seq - self._opened_at_seq,
            bytes_written=self._flushed_bytes + len(self._buf),
            fsyncs=fsyncs,
            snapshots=self._snapshots_written,
            snapshot_bytes=self._snapshot_bytes,
            fsync_seconds=fsync_seconds,
        )

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ValueError("journal writer is closed")

    def close(self) -> None:
        """Wait for a snapshot's child, flush, stop the syncer and release the directory.
        Idempotent."""
        if self._fd < 0:
            return
        try:
            self.poll_snapshot(wait=True)
            self.flush()
        finally:
            # Joined before the fds close, so no fsync can hit a closed or reused fd number.
            self._syncer.close()
            os.close(self._fd)
            os.close(self._lock_fd)
            self._fd = -1
            # append() skips an explicit closed check to stay cheap; packing fails instead.
            self._pack = _closed

    def __enter__(self) -> JournalWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
