"""Reading a journal back: frame checks, torn-tail rules, snapshot choice, :func:`replay`."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._format import (
    HEADER,
    HEADER_SIZE,
    MAX_RECORD_BYTES,
    SEGMENT_RE,
    SNAPSHOT_RE,
    JournalCorrupt,
    PathLike,
    listing,
    unpack,
)


@dataclass(frozen=True, slots=True)
class Scan:
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
    if size - offset < HEADER_SIZE:
        return _torn_or_raise(data, offset, path, "truncated header", last=last, rest=size)
    length, crc = HEADER.unpack_from(data, offset)
    end = offset + HEADER_SIZE + length
    if length == 0 or length > MAX_RECORD_BYTES:
        reason = f"bad frame length {length}"
        return _torn_or_raise(data, offset, path, reason, last=last, rest=offset)
    if end > size:
        return _torn_or_raise(data, offset, path, "truncated payload", last=last, rest=size)
    if zlib.crc32(memoryview(data)[offset + HEADER_SIZE : end]) != crc:
        return _torn_or_raise(data, offset, path, "crc mismatch", last=last, rest=end)
    return end


def _decode(payload: memoryview, expected: int, path: Path, offset: int) -> Any:
    try:
        seq, record = unpack(payload)
    except (ValueError, TypeError) as exc:
        raise JournalCorrupt(path, offset, f"undecodable record: {exc}") from exc
    if seq != expected:
        raise JournalCorrupt(path, offset, f"expected seq {expected}, found {seq}")
    return record


def scan_segment(path: Path, first_seq: int, *, last: bool) -> Scan:
    """Read and verify one segment; only the ``last`` segment may end in a torn frame."""
    data = path.read_bytes()
    view = memoryview(data)
    records: list[Any] = []
    offset = 0
    while offset < len(data):
        end = _frame_end(data, offset, path, last=last)
        if end is None:
            return Scan(records, offset, len(data) - offset)
        payload = view[offset + HEADER_SIZE : end]
        records.append(_decode(payload, first_seq + len(records), path, offset))
        offset = end
    return Scan(records, offset, 0)


def _read_snapshot(path: Path, seq: int) -> dict[Any, Any] | None:
    """The state in a snapshot file, or None when it does not verify."""
    data = path.read_bytes()
    if len(data) < HEADER_SIZE:
        return None
    length, crc = HEADER.unpack_from(data)
    payload = memoryview(data)[HEADER_SIZE:]
    if length != len(payload) or zlib.crc32(payload) != crc:
        return None
    try:
        found_seq, state = unpack(payload)
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


def without_empty_tail(segments: list[tuple[int, Path]]) -> list[tuple[int, Path]]:
    """Drop an empty last segment that does not follow on from the one before it.

    The writer creates the next segment when it takes a snapshot, before its log thread
    has written the previous segment's last batch; a crash in between leaves an empty
    segment after a torn one. It holds no records, so that is a torn tail, not damage.
    """
    if len(segments) < 2 or segments[-1][1].stat().st_size:
        return segments
    (first, path), (nxt, _) = segments[-2], segments[-1]
    scan = scan_segment(path, first, last=True)
    return segments if first + len(scan.records) == nxt else segments[:-1]


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
        scan = scan_segment(path, first, last=index == len(live) - 1)
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
    snapshots = listing(root, SNAPSHOT_RE)
    snapshot_seq, state, bad = _newest_valid_snapshot(snapshots)
    records, torn = _records_after(without_empty_tail(listing(root, SEGMENT_RE)), snapshot_seq)
    result = Replay(state, snapshot_seq, records, torn, bad)
    if snapshots and result.last_seq < snapshots[-1][0]:
        newest_seq, newest = snapshots[-1]
        reason = f"unreadable snapshot and records only reach seq {result.last_seq}"
        raise JournalCorrupt(newest, 0, f"{reason}, not {newest_seq}")
    return result
