"""File-system steps of the writer: the directory lock, recovery at open, durable writes."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import msgpack

from asyncrl.runtime.contract.whole_dirs import fsync_directory

from ._format import (
    LOCK_NAME,
    MAX_SNAPSHOT_BYTES,
    SEGMENT_RE,
    SNAPSHOT_RE,
    frame_header,
    listing,
    segment_name,
    snapshot_name,
)
from ._replay import scan_segment, without_empty_tail

# O_APPEND: a segment is only ever extended, even if the recovered offset were off.
OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


class JournalLocked(RuntimeError):
    """Another :class:`JournalWriter` already holds the journal directory."""


@dataclass(frozen=True, slots=True)
class Layout:
    """What :meth:`JournalWriter.open` found on disk."""

    segments: list[int]  # first seqs, ascending
    snapshots: list[int]  # seqs, ascending
    last_seq: int
    tail_next: int | None  # seq the last segment would hold next; None without segments


def write_all(fd: int, data: bytes | bytearray) -> None:
    with memoryview(data) as view:
        written = 0
        while written < len(view):
            written += os.write(fd, view[written:])


def lock(root: Path) -> int:
    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalLocked(f"{root} is open in another JournalWriter") from None
    return fd


def _settle_tail(path: Path, size: int, *, torn: bool) -> None:
    """Cut a torn tail off and fsync what is left.

    The fsync matters even without a tear: a writer that died (a process crash, not a machine
    crash) may have left records in the page cache only, and the new writer reports everything
    found at open as durable.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        if torn:
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def recover(root: Path) -> Layout:
    """Inspect the directory, cut a torn tail off the last segment, drop stale temp files."""
    for entry in os.scandir(root):
        if entry.name.endswith(".tmp"):
            os.unlink(entry.path)
    found = listing(root, SEGMENT_RE)
    kept = without_empty_tail(found)
    for _, path in found[len(kept) :]:
        path.unlink()  # an empty segment after a torn one: see without_empty_tail
    segments = [seq for seq, _ in kept]
    snapshots = [seq for seq, _ in listing(root, SNAPSHOT_RE)]
    last_seq = snapshots[-1] if snapshots else 0
    if not segments:
        return Layout(segments, snapshots, last_seq, None)
    path = root / segment_name(segments[-1])
    scan = scan_segment(path, segments[-1], last=True)
    _settle_tail(path, scan.end, torn=bool(scan.torn))
    tail_next = segments[-1] + len(scan.records)
    return Layout(segments, snapshots, max(last_seq, tail_next - 1), tail_next)


def pack_snapshot(seq: int, state: dict[Any, Any]) -> bytes:
    """The snapshot file's bytes: one frame holding ``[seq, state]``."""
    payload = msgpack.packb([seq, state], use_bin_type=True)
    if len(payload) > MAX_SNAPSHOT_BYTES:
        raise ValueError(f"snapshot of {len(payload)} bytes does not fit a frame")
    return frame_header(payload) + payload


def store_snapshot(root: Path, seq: int, frame: bytes) -> None:
    """Durably write a packed snapshot as snapshot ``seq``.

    Written to a temp file, fsynced and renamed, so a crash leaves the old set of snapshots or
    the new one, never a half-written file under a snapshot's name. The directory fsync also
    makes any segment created before the call durable by name.
    """
    write_snapshot_temp(root, seq, frame)
    publish_snapshot(root, seq)


def snapshot_temp(root: Path, seq: int) -> Path:
    final = root / snapshot_name(seq)
    return final.with_name(final.name + ".tmp")


def write_snapshot_temp(root: Path, seq: int, frame: bytes) -> None:
    """The first half of :func:`store_snapshot`: the temp file, written and fsynced."""
    fd = os.open(
        snapshot_temp(root, seq), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
    )
    try:
        write_all(fd, frame)
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_snapshot(root: Path, seq: int) -> None:
    """The second half of :func:`store_snapshot`: the temp file under its name, durably."""
    os.replace(snapshot_temp(root, seq), root / snapshot_name(seq))
    fsync_directory(root)


def obsolete_files(root: Path, snapshots: list[int], segments: list[int]) -> list[Path]:
    """What to delete to keep the newest two snapshots and the segments replay needs.

    Every segment with records after the older kept snapshot stays. ``snapshots`` and
    ``segments`` (seqs, ascending) are updated in place; the caller deletes the files once
    the newest snapshot is durable.
    """
    fallback = snapshots[-2] if len(snapshots) > 1 else 0
    doomed = [root / snapshot_name(seq) for seq in snapshots[:-2]]
    del snapshots[:-2]
    # A segment's last record is the next segment's first seq minus one.
    obsolete = [first for first, nxt in pairwise(segments) if nxt <= fallback + 1]
    doomed += [root / segment_name(first) for first in obsolete]
    del segments[: len(obsolete)]
    return doomed


@dataclass(frozen=True, slots=True)
class SnapshotSlot:
    """A snapshot begun: its seq, and the segment's fd it ended (-1: none ended)."""

    seq: int
    old_fd: int


def retire(store: Callable[[], None], old_fd: int, doomed: list[Path]) -> None:
    """A snapshot's disk work, after the records before it: store it, then clean up.

    The old segment's fd closes only here, after its last batch was written and fsynced,
    and files go only once the snapshot that makes them unneeded is durable.
    """
    store()  # its directory fsync also covers the new segment
    if old_fd >= 0:
        os.close(old_fd)
    for path in doomed:
        os.unlink(path)


def unlink_snapshot_temp(root: Path, seq: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(snapshot_temp(root, seq))
