"""Durable journal for the scheduler core: batched-fsync record log plus snapshots.

The scheduler core is a deterministic state machine. Each state change is a *record* (a plain
msgpack value, conventionally a list starting with a small int opcode), and replaying the
records in order on a fresh core rebuilds the same state. The core can also export its whole
state as a *snapshot* dict. This module only stores and returns those values; it never looks
inside a record.

On-disk layout (one directory per run)
--------------------------------------
``journal-<first_seq:012d>.log``
    A segment: frames for records ``first_seq, first_seq + 1, ...`` back to back, no file
    header. Sequence numbers run 1, 2, 3, ... across the whole run, with no gaps across
    segments. A new segment starts after every snapshot.
``snapshot-<seq:012d>.msgpack``
    One frame whose payload is ``msgpack([seq, state])``: the state after record ``seq``.
``snapshot-<seq:012d>.msgpack.tmp``
    A snapshot being written. Never read; the next writer deletes it.
``lock``
    Empty file, ``flock``-ed by the single open :class:`JournalWriter`.

Frame: ``<u32 length><u32 crc32(payload)><payload>``, little endian, ``0 < length <= 64 MiB``
for records. A record's payload is ``msgpack.packb([seq, record], use_bin_type=True)``.

Values come back as msgpack decodes them (``raw=False, strict_map_key=False``): tuples come
back as lists, str stays str, bytes stays bytes, map keys may be ints.

Recovery rules (see :func:`replay`):

* A damaged frame at the very end of the *last* segment is a torn write from a crash and is
  ignored: a short header, a short payload, a crc mismatch on the final frame, or a damaged
  frame followed only by zero bytes (some filesystems expose zero-filled blocks after a crash).
  :meth:`JournalWriter.open` truncates it away before appending.
* Any other damage (a bad frame followed by data, a damaged non-last segment, a seq gap within
  or between segments) raises :class:`JournalCorrupt` naming the file and byte offset.
* The newest snapshot whose crc and seq check out is used; older ones are fallbacks. The writer
  keeps the newest two snapshots and every segment with records after the older of them.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import msgpack

__all__ = [
    "MAX_RECORD_BYTES",
    "JournalCorrupt",
    "JournalLocked",
    "JournalStats",
    "JournalWriter",
    "Replay",
    "replay",
    "segment_name",
    "snapshot_name",
]

_HEADER = struct.Struct("<II")
_HEADER_SIZE = _HEADER.size
# A bit flip in a length field must not pass for a torn tail, so absurd lengths are corruption.
MAX_RECORD_BYTES = 64 << 20
_MAX_SNAPSHOT_BYTES = 0xFFFFFFFF
_SEGMENT_RE = re.compile(r"journal-(\d{12,})\.log")
_SNAPSHOT_RE = re.compile(r"snapshot-(\d{12,})\.msgpack")
_LOCK_NAME = "lock"
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC

PathLike = str | os.PathLike[str]


class JournalCorrupt(Exception):
    """The journal is damaged somewhere other than a torn tail; ``path``/``offset`` say where."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path} at byte {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class JournalLocked(RuntimeError):
    """Another :class:`JournalWriter` already holds the journal directory."""


def segment_name(first_seq: int) -> str:
    return f"journal-{first_seq:012d}.log"


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:012d}.msgpack"


def _unpack(payload: bytes | memoryview) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def _listing(root: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    """(seq, path) of every file in ``root`` whose name matches ``pattern``, by seq."""
    found = []
    for entry in os.scandir(root):
        match = pattern.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class _Scan:
    records: list[Any]  # records[i] has seq first_seq + i
    end: int  # byte offset just past the last good frame
    torn: int  # bytes after ``end`` that were ignored as a torn tail


def _torn_or_raise(
    data: bytes, offset: int, path: Path, reason: str, *, last: bool, rest: int
) -> None:
    """Return None if the damaged frame at ``offset`` is a torn tail, else raise.

    It is torn when it is in the last segment and only zero bytes follow byte ``rest`` (where
    the frame claims to end): a crash can leave a partial frame and zero-filled blocks at the
    end of a file, but never real data after them.
    """
    if last and data.count(0, rest) == len(data) - rest:
        return None
    raise JournalCorrupt(path, offset, reason)


def _frame_end(data: bytes, offset: int, path: Path, *, last: bool) -> int | None:
    """End offset of the valid frame at ``offset``, None for a torn tail, else raise."""
    size = len(data)
    if size - offset < _HEADER_SIZE:
        return _torn_or_raise(data, offset, path, "truncated header", last=last, rest=size)
    length, crc = _HEADER.unpack_from(data, offset)
    end = offset + _HEADER_SIZE + length
    if length == 0 or length > MAX_RECORD_BYTES:
        reason = f"bad frame length {length}"
        return _torn_or_raise(data, offset, path, reason, last=last, rest=offset)
    if end > size:
        return _torn_or_raise(data, offset, path, "truncated payload", last=last, rest=size)
    if zlib.crc32(memoryview(data)[offset + _HEADER_SIZE : end]) != crc:
        return _torn_or_raise(data, offset, path, "crc mismatch", last=last, rest=end)
    return end


def _decode(payload: memoryview, expected: int, path: Path, offset: int) -> Any:
    try:
        seq, record = _unpack(payload)
    except (ValueError, TypeError) as exc:
        raise JournalCorrupt(path, offset, f"undecodable record: {exc}") from exc
    if seq != expected:
        raise JournalCorrupt(path, offset, f"expected seq {expected}, found {seq}")
    return record


def _scan_segment(path: Path, first_seq: int, *, last: bool) -> _Scan:
    """Read and verify one segment; only the ``last`` segment may end in a torn frame."""
    data = path.read_bytes()
    view = memoryview(data)
    records: list[Any] = []
    offset = 0
    while offset < len(data):
        end = _frame_end(data, offset, path, last=last)
        if end is None:
            return _Scan(records, offset, len(data) - offset)
        payload = view[offset + _HEADER_SIZE : end]
        records.append(_decode(payload, first_seq + len(records), path, offset))
        offset = end
    return _Scan(records, offset, 0)


def _read_snapshot(path: Path, seq: int) -> dict[Any, Any] | None:
    """The state in a snapshot file, or None when it does not verify."""
    data = path.read_bytes()
    if len(data) < _HEADER_SIZE:
        return None
    length, crc = _HEADER.unpack_from(data)
    payload = memoryview(data)[_HEADER_SIZE:]
    if length != len(payload) or zlib.crc32(payload) != crc:
        return None
    try:
        found_seq, state = _unpack(payload)
    except (ValueError, TypeError):
        return None
    return state if found_seq == seq and isinstance(state, dict) else None


@dataclass(frozen=True)
class Replay:
    """What a journal directory holds.

    ``records`` are the records after the snapshot, in order and without gaps:
    ``records[i]`` has seq ``snapshot_seq + 1 + i``. They come back as msgpack decodes them
    (tuples as lists). ``bad_snapshots`` lists newer snapshot files that failed to verify and
    were skipped.
    """

    snapshot: dict[Any, Any] | None
    snapshot_seq: int
    records: list[Any]
    torn_bytes: int = 0
    bad_snapshots: tuple[Path, ...] = ()

    @property
    def last_seq(self) -> int:
        return self.snapshot_seq + len(self.records)


def _newest_valid_snapshot(
    snapshots: list[tuple[int, Path]],
) -> tuple[int, dict[Any, Any] | None, tuple[Path, ...]]:
    bad: list[Path] = []
    for seq, path in reversed(snapshots):
        state = _read_snapshot(path, seq)
        if state is not None:
            return seq, state, tuple(bad)
        bad.append(path)
    return 0, None, tuple(bad)


def _segments_after(segments: list[tuple[int, Path]], after: int) -> list[tuple[int, Path]]:
    """Drop the leading segments whose records all have seq <= ``after``."""
    skip = 0
    while skip + 1 < len(segments) and segments[skip + 1][0] <= after + 1:
        skip += 1
    return segments[skip:]


def _records_after(segments: list[tuple[int, Path]], after: int) -> tuple[list[Any], int]:
    """Records with seq > ``after``, checked for gaps, and the torn tail size."""
    live = _segments_after(segments, after)
    if not live:
        return [], 0
    records: list[Any] = []
    expected, torn = live[0][0], 0
    if expected > after + 1:
        raise JournalCorrupt(live[0][1], 0, f"records {after + 1}..{expected - 1} are missing")
    for index, (first, path) in enumerate(live):
        if first != expected:
            raise JournalCorrupt(path, 0, f"segment starts at seq {first}, expected {expected}")
        scan = _scan_segment(path, first, last=index == len(live) - 1)
        records.extend(scan.records[max(0, after + 1 - first) :])
        expected, torn = first + len(scan.records), scan.torn
    return records, torn


def replay(directory: PathLike) -> Replay:
    """Read a journal directory back: newest valid snapshot plus the records after it.

    A missing or empty directory replays to nothing. Raises :class:`JournalCorrupt` for damage
    other than a torn tail, and when the journal does not reach the newest snapshot's seq
    (an unreadable snapshot whose records are gone cannot be recovered).
    """
    root = Path(directory)
    if not root.is_dir():
        return Replay(None, 0, [])
    snapshots = _listing(root, _SNAPSHOT_RE)
    snapshot_seq, state, bad = _newest_valid_snapshot(snapshots)
    records, torn = _records_after(_listing(root, _SEGMENT_RE), snapshot_seq)
    result = Replay(state, snapshot_seq, records, torn, bad)
    if snapshots and result.last_seq < snapshots[-1][0]:
        newest_seq, newest = snapshots[-1]
        reason = f"unreadable snapshot and records only reach seq {result.last_seq}"
        raise JournalCorrupt(newest, 0, f"{reason}, not {newest_seq}")
    return result


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True, slots=True)
class JournalStats:
    """Counters for one writer since it was opened.

    ``bytes_written`` counts record frame bytes (header included), buffered ones too;
    ``fsyncs`` counts fsyncs of segment data (not of snapshots or the directory).
    """

    records: int
    bytes_written: int
    fsyncs: int
    snapshots: int
    snapshot_bytes: int


@dataclass(frozen=True, slots=True)
class _Layout:
    """What :meth:`JournalWriter.open` found on disk."""

    segments: list[int]  # first seqs, ascending
    snapshots: list[int]  # seqs, ascending
    last_seq: int
    tail_next: int | None  # seq the last segment would hold next; None without segments


def _write_all(fd: int, data: bytes | bytearray) -> None:
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])


def _fsync_dir(root: Path) -> None:
    # Makes a created, renamed or removed name durable, not just the file's contents.
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(root: Path) -> int:
    fd = os.open(root / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalLocked(f"{root} is open in another JournalWriter") from None
    return fd


def _truncate(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _recover(root: Path) -> _Layout:
    """Inspect the directory, cut a torn tail off the last segment, drop stale temp files."""
    for entry in os.scandir(root):
        if entry.name.endswith(".tmp"):
            os.unlink(entry.path)
    segments = [seq for seq, _ in _listing(root, _SEGMENT_RE)]
    snapshots = [seq for seq, _ in _listing(root, _SNAPSHOT_RE)]
    last_seq = snapshots[-1] if snapshots else 0
    if not segments:
        return _Layout(segments, snapshots, last_seq, None)
    path = root / segment_name(segments[-1])
    scan = _scan_segment(path, segments[-1], last=True)
    if scan.torn:
        _truncate(path, scan.end)
    tail_next = segments[-1] + len(scan.records)
    return _Layout(segments, snapshots, max(last_seq, tail_next - 1), tail_next)


def _closed(_obj: object) -> NoReturn:
    raise ValueError("journal writer is closed")


def _check_options(fsync_every: int, fsync_interval_s: float, snapshot_every: int) -> None:
    if fsync_every < 1 or snapshot_every < 1 or fsync_interval_s < 0:
        raise ValueError("fsync_every and snapshot_every must be >= 1, fsync_interval_s >= 0")


class JournalWriter:
    """Appends records to a journal directory; the only writer of that directory.

    Records are framed into an in-memory buffer and handed to the OS, then fsynced, once
    ``fsync_every`` records are pending or ``fsync_interval_s`` has passed since the first
    pending one (checked on each append; call :meth:`flush_if_due` from an idle timer and
    :meth:`flush` to force it). A crash may lose records appended since the last fsync; it
    never loses or damages earlier ones. After an ``OSError`` the writer must be discarded;
    reopening the directory recovers it.

    Build one with :meth:`open`.
    """

    def __init__(
        self,
        root: Path,
        lock_fd: int,
        layout: _Layout,
        *,
        fsync_every: int,
        fsync_interval_s: float,
        snapshot_every: int,
        clock: Callable[[], float],
    ) -> None:
        self._root = root
        self._lock_fd = lock_fd
        self._fsync_every = fsync_every
        self._fsync_interval_s = fsync_interval_s
        self._snapshot_every = snapshot_every
        self._clock = clock
        self._pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
        self._buf = bytearray()
        self._pending = 0  # records appended since the last fsync
        self._first_pending_at = 0.0
        self._segments = list(layout.segments)
        self._snapshots = list(layout.snapshots)
        self._seq = self._opened_at_seq = layout.last_seq
        self._fd = -1
        self._segment_first = 0
        self._fsyncs = self._flushed_bytes = self._snapshot_bytes = self._snapshots_written = 0
        self._open_tail(layout.tail_next)

    @classmethod
    def open(
        cls,
        directory: PathLike,
        *,
        fsync_every: int = 256,
        fsync_interval_s: float = 0.05,
        snapshot_every: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> JournalWriter:
        """Open (creating if needed) a journal directory for appending after its last record.

        Raises :class:`JournalLocked` if another writer holds it and :class:`JournalCorrupt`
        if its last segment is damaged beyond a torn tail.
        """
        _check_options(fsync_every, fsync_interval_s, snapshot_every)
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        lock_fd = _lock(root)
        try:
            layout = _recover(root)
            return cls(
                root,
                lock_fd,
                layout,
                fsync_every=fsync_every,
                fsync_interval_s=fsync_interval_s,
                snapshot_every=snapshot_every,
                clock=clock,
            )
        except BaseException:
            os.close(lock_fd)
            raise

    # ------------------------------------------------------------------ hot path

    def append(self, record: Any) -> int:
        """Append one record and return its seq."""
        seq = self._seq + 1
        payload = self._pack([seq, record])
        if len(payload) > MAX_RECORD_BYTES:
            raise ValueError(f"record of {len(payload)} bytes exceeds {MAX_RECORD_BYTES}")
        buf = self._buf
        buf += _HEADER.pack(len(payload), zlib.crc32(payload))
        buf += payload
        self._seq = seq
        self._pending += 1
        if self._pending == 1:
            self._first_pending_at = self._clock()
        if (
            self._pending >= self._fsync_every
            or self._clock() - self._first_pending_at >= self._fsync_interval_s
        ):
            self.flush()
        return seq

    def append_many(self, records: Iterable[Any]) -> int:
        """Append records in order; returns the last seq (unchanged if ``records`` is empty)."""
        append = self.append
        for record in records:
            append(record)
        return self._seq

    def flush(self) -> None:
        """Hand buffered records to the OS and fsync them."""
        self._check_open()
        if self._buf:
            _write_all(self._fd, self._buf)
            self._flushed_bytes += len(self._buf)
            self._buf.clear()
        if self._pending:
            os.fsync(self._fd)
            self._fsyncs += 1
            self._pending = 0

    def flush_if_due(self) -> bool:
        """Flush if the oldest pending record has waited ``fsync_interval_s``; for idle timers."""
        due = bool(self._pending) and (
            self._clock() - self._first_pending_at >= self._fsync_interval_s
        )
        if due:
            self.flush()
        return due

    # ------------------------------------------------------------------ snapshots

    @property
    def needs_snapshot(self) -> bool:
        """True once ``snapshot_every`` records were appended since the newest snapshot."""
        newest = self._snapshots[-1] if self._snapshots else 0
        return self._seq - newest >= self._snapshot_every

    def write_snapshot(self, state: dict[Any, Any], seq: int | None = None) -> int:
        """Durably store ``state`` as the state after record ``seq`` (default: the last one).

        Then starts a new segment and deletes files no longer needed for replay. Returns seq.
        """
        seq = self._seq if seq is None else seq
        newest = self._snapshots[-1] if self._snapshots else 0
        if not newest < seq <= self._seq:
            raise ValueError(f"snapshot seq must be in ({newest}, {self._seq}], got {seq}")
        # The records up to seq must be durable before a snapshot claims to follow them.
        self.flush()
        self._store_snapshot(seq, msgpack.packb([seq, state], use_bin_type=True))
        if self._segment_first <= self._seq:
            self._start_segment(self._seq + 1)
        self._remove_obsolete()
        return seq

    def _store_snapshot(self, seq: int, payload: bytes) -> None:
        if len(payload) > _MAX_SNAPSHOT_BYTES:
            raise ValueError(f"snapshot of {len(payload)} bytes does not fit a frame")
        final = self._root / snapshot_name(seq)
        tmp = final.with_name(final.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _write_all(fd, _HEADER.pack(len(payload), zlib.crc32(payload)) + payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        _fsync_dir(self._root)
        self._snapshots.append(seq)
        self._snapshots_written += 1
        self._snapshot_bytes += _HEADER_SIZE + len(payload)

    def _open_tail(self, tail_next: int | None) -> None:
        """Append to the last segment, unless it does not end right before the next seq."""
        if tail_next != self._seq + 1:
            # No segment yet, or the newest snapshot is past the last segment's records.
            self._start_segment(self._seq + 1)
            return
        self._segment_first = self._segments[-1]
        self._fd = os.open(self._root / segment_name(self._segment_first), _OPEN_FLAGS, 0o644)

    def _start_segment(self, first_seq: int) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self._root / segment_name(first_seq), _OPEN_FLAGS, 0o644)
        _fsync_dir(self._root)
        self._segments.append(first_seq)
        self._segment_first = first_seq

    def _remove_obsolete(self) -> None:
        """Keep the newest two snapshots and every segment with records after the older one."""
        fallback = self._snapshots[-2] if len(self._snapshots) > 1 else 0
        for seq in self._snapshots[:-2]:
            os.unlink(self._root / snapshot_name(seq))
        del self._snapshots[:-2]
        # A segment's last record is the next segment's first seq minus one.
        obsolete = [first for first, nxt in pairwise(self._segments) if nxt <= fallback + 1]
        for first in obsolete:
            os.unlink(self._root / segment_name(first))
        del self._segments[: len(obsolete)]

    # ------------------------------------------------------------------ lifecycle

    @property
    def directory(self) -> Path:
        return self._root

    @property
    def last_seq(self) -> int:
        """Seq of the last appended record (0 for an empty journal)."""
        return self._seq

    @property
    def stats(self) -> JournalStats:
        return JournalStats(
            records=self._seq - self._opened_at_seq,
            bytes_written=self._flushed_bytes + len(self._buf),
            fsyncs=self._fsyncs,
            snapshots=self._snapshots_written,
            snapshot_bytes=self._snapshot_bytes,
        )

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ValueError("journal writer is closed")

    def close(self) -> None:
        """Flush and release the directory. Idempotent."""
        if self._fd < 0:
            return
        try:
            self.flush()
        finally:
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
