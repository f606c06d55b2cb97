"""Tests for the scheduler journal: framing, torn tails, corruption, snapshots, fsync batching.

Tests that count fsyncs use ``background_fsync=False`` so the counts do not depend on when
the syncer thread runs; the background syncer has its own section at the end.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.runtime.scheduler.journal import (
    JournalCorrupt,
    JournalLocked,
    JournalWriter,
    replay,
    segment_name,
    snapshot_name,
)

HEADER = struct.Struct("<II")


def make_records(count: int, start: int = 1) -> list[list[Any]]:
    return [
        [3, seq, "x" * (seq % 5), [seq, seq * 2], {"k": seq}] for seq in range(start, count + 1)
    ]


def write(directory: Path, records: list[Any], **options: Any) -> None:
    with JournalWriter.open(directory, **options) as writer:
        writer.append_many(records)


def frame_offsets(path: Path) -> list[int]:
    """Start offset of every frame in a segment, plus the file size at the end."""
    data = path.read_bytes()
    offsets = [0]
    while offsets[-1] < len(data):
        (length,) = struct.unpack_from("<I", data, offsets[-1])
        offsets.append(offsets[-1] + HEADER.size + length)
    return offsets


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("journal-*.log"))


def snapshots(directory: Path) -> list[Path]:
    return sorted(directory.glob("snapshot-*.msgpack"))


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def apply(state: dict[str, Any], record: list[Any]) -> None:
    """A toy state machine for snapshot tests: record [1, key, delta] adds delta to key."""
    state[record[1]] = state.get(record[1], 0) + record[2]


def rebuild(directory: Path) -> dict[str, Any]:
    result = replay(directory)
    state = dict(result.snapshot or {})
    for record in result.records:
        apply(state, record)
    return state


# --------------------------------------------------------------------------- round trip


def test_round_trip(tmp_path: Path) -> None:
    records = [*make_records(50), [7, None, 1.5, b"raw", {1: "int key"}], (9, (1, 2))]
    write(tmp_path, records, fsync_every=8)
    result = replay(tmp_path)
    assert result.snapshot is None
    assert result.snapshot_seq == 0
    assert result.torn_bytes == 0
    # Tuples come back as lists; everything else as written.
    assert result.records == [*records[:-1], [9, [1, 2]]]
    assert result.last_seq == len(records)


def test_append_returns_consecutive_seqs_across_reopen(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path) as writer:
        assert [writer.append([0, i]) for i in range(3)] == [1, 2, 3]
    with JournalWriter.open(tmp_path) as writer:
        assert writer.last_seq == 3
        assert writer.append_many([[0, 3], [0, 4]]) == 5
        assert writer.append_many([]) == 5
    assert replay(tmp_path).records == [[0, i] for i in range(5)]


def test_missing_and_empty_directories_replay_to_nothing(tmp_path: Path) -> None:
    for directory in (tmp_path / "absent", tmp_path):
        result = replay(directory)
        assert (result.snapshot, result.snapshot_seq, result.records) == (None, 0, [])


def test_unserialisable_record_consumes_no_seq(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path) as writer:
        writer.append([1])
        with pytest.raises(TypeError):
            writer.append([2, object()])
        assert writer.append([3]) == 2
    assert replay(tmp_path).records == [[1], [3]]


def test_closed_writer_rejects_appends(tmp_path: Path) -> None:
    writer = JournalWriter.open(tmp_path)
    writer.close()
    writer.close()
    assert writer.closed
    with pytest.raises(ValueError, match="closed"):
        writer.append([1])
    with pytest.raises(ValueError, match="closed"):
        writer.flush()


def test_second_writer_is_refused(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path), pytest.raises(JournalLocked):
        JournalWriter.open(tmp_path)
    JournalWriter.open(tmp_path).close()


# --------------------------------------------------------------------------- torn tails


def test_torn_tail_at_every_byte_of_the_last_frames(tmp_path: Path) -> None:
    records = make_records(12)
    original = tmp_path / "original"
    write(original, records)
    segment = segments(original)[0]
    offsets = frame_offsets(segment)
    complete_frames = len(offsets) - 1
    for cut in range(offsets[-4], offsets[-1] + 1):
        directory = tmp_path / f"cut-{cut}"
        shutil.copytree(original, directory)
        os.truncate(directory / segment.name, cut)
        kept = max(i for i, offset in enumerate(offsets) if offset <= cut)
        result = replay(directory)
        assert result.records == records[:kept]
        assert result.torn_bytes == cut - offsets[kept]
        with JournalWriter.open(directory) as writer:
            assert writer.append(["after"]) == kept + 1
        assert replay(directory).records == [*records[:kept], ["after"]]
        assert replay(directory).torn_bytes == 0
    assert complete_frames == len(records)


def test_crc_mismatch_in_the_final_frame_is_torn(tmp_path: Path) -> None:
    write(tmp_path, make_records(5))
    segment = segments(tmp_path)[0]
    flip_byte(segment, segment.stat().st_size - 1)
    result = replay(tmp_path)
    assert result.records == make_records(4)
    assert result.torn_bytes == frame_offsets(segment)[-1] - frame_offsets(segment)[-2]


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    write(tmp_path, make_records(6))
    segment = segments(tmp_path)[0]
    offsets = frame_offsets(segment)
    data = bytearray(segment.read_bytes())
    # As after a crash that persisted the file size but not the last blocks.
    data[offsets[4] + 5 :] = bytes(len(data) - offsets[4] - 5) + bytes(4096)
    segment.write_bytes(bytes(data))
    result = replay(tmp_path)
    assert result.records == make_records(4)
    assert result.torn_bytes == len(data) - offsets[4]
    with JournalWriter.open(tmp_path) as writer:
        assert writer.append(["next"]) == 5
    assert replay(tmp_path).records == [*make_records(4), ["next"]]


# --------------------------------------------------------------------------- corruption


def test_bad_frame_in_the_middle_is_corrupt(tmp_path: Path) -> None:
    write(tmp_path, make_records(10))
    segment = segments(tmp_path)[0]
    offsets = frame_offsets(segment)
    flip_byte(segment, offsets[4] + HEADER.size + 2)
    with pytest.raises(JournalCorrupt, match=segment.name) as info:
        replay(tmp_path)
    assert info.value.offset == offsets[4]
    assert info.value.path == segment
    with pytest.raises(JournalCorrupt):
        JournalWriter.open(tmp_path)


def test_absurd_length_field_is_corrupt_not_torn(tmp_path: Path) -> None:
    write(tmp_path, make_records(10))
    segment = segments(tmp_path)[0]
    offsets = frame_offsets(segment)
    flip_byte(segment, offsets[3] + 3)  # high byte of the length
    with pytest.raises(JournalCorrupt, match="length") as info:
        replay(tmp_path)
    assert info.value.offset == offsets[3]


def test_seq_gap_inside_a_segment_is_corrupt(tmp_path: Path) -> None:
    write(tmp_path, make_records(6))
    segment = segments(tmp_path)[0]
    offsets = frame_offsets(segment)
    data = segment.read_bytes()
    segment.write_bytes(data[: offsets[2]] + data[offsets[3] :])
    with pytest.raises(JournalCorrupt, match="expected seq 3, found 4"):
        replay(tmp_path)


def append_toy_run(writer: JournalWriter, count: int) -> None:
    """Append ``count`` toy records, snapshotting the toy state whenever the writer asks."""
    state: dict[str, Any] = {}
    for i in range(count):
        record = [1, f"k{i % 3}", i]
        writer.append(record)
        apply(state, record)
        if writer.needs_snapshot:
            writer.write_snapshot(state)


def rolled_journal(directory: Path) -> list[Path]:
    """Three snapshots of a toy state, leaving two snapshots and several segments."""
    with JournalWriter.open(directory, snapshot_every=10) as writer:
        append_toy_run(writer, 45)
    return segments(directory)


def test_damaged_earlier_segment_is_corrupt_even_at_its_end(tmp_path: Path) -> None:
    logs = rolled_journal(tmp_path)
    size = logs[0].stat().st_size
    os.truncate(logs[0], size - 1)
    # The newest snapshot does not need that segment; the fallback does.
    flip_byte(snapshots(tmp_path)[-1], -1)
    with pytest.raises(JournalCorrupt, match=logs[0].name):
        replay(tmp_path)


def test_missing_segment_is_a_gap(tmp_path: Path) -> None:
    write(tmp_path, make_records(30), snapshot_every=10)
    with JournalWriter.open(tmp_path) as writer:
        writer.write_snapshot({"a": 1})
        writer.append_many(make_records(40, start=31))
        writer.flush()
        writer.write_snapshot({"a": 2})
        writer.append_many(make_records(45, start=41))
    logs = segments(tmp_path)
    assert [p.name for p in logs] == [segment_name(31), segment_name(41)]
    flip_byte(snapshots(tmp_path)[-1], -1)
    logs[0].unlink()
    with pytest.raises(JournalCorrupt, match=r"records 31\.\.40 are missing"):
        replay(tmp_path)


# --------------------------------------------------------------------------- snapshots


def test_snapshots_roll_segments_and_clean_up(tmp_path: Path) -> None:
    logs = rolled_journal(tmp_path)
    assert [p.name for p in snapshots(tmp_path)] == [snapshot_name(30), snapshot_name(40)]
    # Segments with records after the older kept snapshot (31..) stay; 1..30 are gone.
    assert [p.name for p in logs] == [segment_name(31), segment_name(41)]
    result = replay(tmp_path)
    assert result.snapshot_seq == 40
    assert result.records == [[1, f"k{i % 3}", i] for i in range(40, 45)]
    assert rebuild(tmp_path) == full_state(45)
    assert not list(tmp_path.glob("*.tmp"))


def full_state(count: int) -> dict[str, int]:
    state: dict[str, Any] = {}
    for i in range(count):
        apply(state, [1, f"k{i % 3}", i])
    return state


def test_corrupt_newest_snapshot_falls_back_to_the_older_one(tmp_path: Path) -> None:
    rolled_journal(tmp_path)
    newest = snapshots(tmp_path)[-1]
    flip_byte(newest, newest.stat().st_size - 1)
    result = replay(tmp_path)
    assert result.snapshot_seq == 30
    assert result.bad_snapshots == (newest,)
    assert len(result.records) == 15
    assert rebuild(tmp_path) == full_state(45)


def test_both_snapshots_corrupt_is_corrupt(tmp_path: Path) -> None:
    rolled_journal(tmp_path)
    for path in snapshots(tmp_path):
        flip_byte(path, 12)
    with pytest.raises(JournalCorrupt, match="missing"):
        replay(tmp_path)


def test_sole_corrupt_snapshot_falls_back_to_full_replay(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path) as writer:
        for i in range(15):
            writer.append([1, "k", i])
        writer.write_snapshot({"k": sum(range(15))})
        writer.append([1, "k", 100])
    flip_byte(snapshots(tmp_path)[0], 9)
    result = replay(tmp_path)
    assert (result.snapshot, result.snapshot_seq, len(result.records)) == (None, 0, 16)
    assert rebuild(tmp_path) == {"k": sum(range(15)) + 100}


def test_truncated_snapshot_and_temp_files(tmp_path: Path) -> None:
    rolled_journal(tmp_path)
    newest = snapshots(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:-3])
    (tmp_path / (snapshot_name(50) + ".tmp")).write_bytes(b"half written")
    assert replay(tmp_path).snapshot_seq == 30
    JournalWriter.open(tmp_path).close()
    assert not list(tmp_path.glob("*.tmp"))


def test_snapshot_seq_must_move_forward(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path) as writer:
        writer.append_many(make_records(5))
        with pytest.raises(ValueError):
            writer.write_snapshot({}, seq=6)
        assert writer.write_snapshot({"at": 3}, seq=3) == 3
        with pytest.raises(ValueError):
            writer.write_snapshot({}, seq=3)
    result = replay(tmp_path)
    assert (result.snapshot, result.records) == ({"at": 3}, make_records(5)[3:])


def test_needs_snapshot_counts_from_the_newest_snapshot(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path, snapshot_every=3) as writer:
        writer.append_many([[0]] * 2)
        assert not writer.needs_snapshot
        writer.append([0])
        assert writer.needs_snapshot
        writer.write_snapshot({})
        assert not writer.needs_snapshot
        writer.append_many([[0]] * 2)
    with JournalWriter.open(tmp_path, snapshot_every=3) as writer:
        assert not writer.needs_snapshot
        writer.append([0])
        assert writer.needs_snapshot


def test_snapshot_without_new_records_keeps_the_segment(tmp_path: Path) -> None:
    with JournalWriter.open(tmp_path) as writer:
        writer.append([1])
        writer.write_snapshot({"n": 1})
    with JournalWriter.open(tmp_path) as writer:
        writer.append([2])
        writer.write_snapshot({"n": 2})
        writer.append([3])
    result = replay(tmp_path)
    assert (result.snapshot, result.snapshot_seq, result.records) == ({"n": 2}, 2, [[3]])
    assert [p.name for p in segments(tmp_path)] == [segment_name(2), segment_name(3)]


def test_reopen_when_snapshot_is_past_the_last_segment(tmp_path: Path) -> None:
    # Not produced by a healthy writer, but a lost segment must not make seqs go backwards.
    with JournalWriter.open(tmp_path) as writer:
        writer.append_many(make_records(5))
        writer.write_snapshot({"n": 5})
    os.truncate(segments(tmp_path)[0], frame_offsets(segments(tmp_path)[0])[4])
    segments(tmp_path)[-1].unlink()
    with JournalWriter.open(tmp_path) as writer:
        assert writer.last_seq == 5
        assert writer.append(["six"]) == 6
    result = replay(tmp_path)
    assert (result.snapshot, result.snapshot_seq, result.records) == ({"n": 5}, 5, [["six"]])


# --------------------------------------------------------------------------- fsync batching


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_fsync_every_n_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    writer = JournalWriter.open(
        tmp_path, fsync_every=4, fsync_interval_s=1e9, clock=FakeClock(), background_fsync=False
    )
    synced.clear()
    writer.append_many(make_records(10))
    assert len(synced) == 2
    # Every fsync boundary leaves the records handed to the OS, readable by another reader.
    assert len(replay(tmp_path).records) == 8
    writer.close()
    assert len(synced) == 3
    stats = writer.stats
    assert (stats.records, stats.fsyncs) == (10, 3)
    assert stats.bytes_written == segments(tmp_path)[0].stat().st_size


def test_fsync_after_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    with JournalWriter.open(
        tmp_path, fsync_every=1000, fsync_interval_s=0.05, clock=clock, background_fsync=False
    ) as writer:
        writer.append([1])
        clock.now = 0.04
        writer.append([2])
        assert writer.stats.fsyncs == 0
        assert not writer.flush_if_due()
        clock.now = 0.051
        writer.append([3])
        assert writer.stats.fsyncs == 1
        # The interval restarts at the next unsynced record, not at the last fsync.
        clock.now = 1.0
        writer.append([4])
        clock.now = 1.04
        writer.append([5])
        assert writer.stats.fsyncs == 1
        clock.now = 1.06
        assert writer.flush_if_due()
        assert writer.stats.fsyncs == 2
        writer.flush()
        assert writer.stats.fsyncs == 2  # nothing pending, nothing to sync


# --------------------------------------------------------------------------- property


def values() -> st.SearchStrategy[Any]:
    leaves = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8)
    leaves = leaves | st.floats(allow_nan=False) | st.binary(max_size=8)
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.text(max_size=4) | st.integers(-(2**63), 2**63), inner, max_size=4)
        ),
        max_leaves=12,
    )


records_strategy = st.lists(
    st.tuples(st.integers(0, 15), values()).map(list), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=records_strategy, snapshot_every=st.integers(3, 50), cut=st.floats(0, 1))
def test_any_cut_of_the_last_segment_replays_a_prefix(
    records: list[Any], snapshot_every: int, cut: float
) -> None:
    # Crashes are simulated by truncation, so real fsyncs would only slow the examples down.
    with tempfile.TemporaryDirectory() as name, pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fsync", lambda fd: None)
        directory = Path(name)
        with JournalWriter.open(directory, fsync_every=7, snapshot_every=snapshot_every) as writer:
            for record in records:
                writer.append(record)
                if writer.needs_snapshot:
                    writer.write_snapshot({"seq": writer.last_seq})
        last = segments(directory)[-1]
        offsets = frame_offsets(last)
        at = round(cut * offsets[-1])
        os.truncate(last, at)
        result = replay(directory)
        expected_seq = int(last.name[8:20]) - 1 + sum(1 for end in offsets[1:] if end <= at)
        assert result.last_seq == expected_seq
        assert result.records == records[result.snapshot_seq : result.last_seq]
        assert result.snapshot in (None, {"seq": result.snapshot_seq})


# --------------------------------------------------------------------------- background fsync


def test_background_flush_leaves_records_replayable(tmp_path: Path) -> None:
    records = make_records(500)
    with JournalWriter.open(tmp_path, fsync_every=16) as writer:
        writer.append_many(records)
        writer.flush()
        # Read while the writer is still open: flush alone must have put everything out.
        assert replay(tmp_path).records == records
        stats = writer.stats
        assert 1 <= stats.fsyncs <= 500 // 16 + 1  # batches may coalesce, never split
        assert stats.fsync_seconds > 0
        assert stats.bytes_written == segments(tmp_path)[0].stat().st_size


@pytest.mark.parametrize("background", [True, False])
def test_durable_seq_advances_after_flush(tmp_path: Path, background: bool) -> None:
    options: dict[str, Any] = {"fsync_every": 1000, "background_fsync": background}
    with JournalWriter.open(tmp_path, **options) as writer:
        assert writer.durable_seq == 0
        writer.append_many(make_records(5))
        assert (writer.last_seq, writer.durable_seq) == (5, 0)  # still buffered
        writer.flush()
        assert writer.durable_seq == 5
        writer.append([6])
        writer.write_snapshot({"n": 6})  # in the background, queued after record 6
        writer.flush()
        assert writer.durable_seq == 6
        assert replay(tmp_path).snapshot_seq == 6
    # What a new writer finds on disk counts as durable from the start.
    with JournalWriter.open(tmp_path, **options) as writer:
        assert writer.durable_seq == writer.last_seq == 6


def journal_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("journal-fsync")]


def test_background_fsyncs_run_off_the_appending_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        threads.append(threading.current_thread())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    with JournalWriter.open(tmp_path, fsync_every=8) as writer:
        threads.clear()  # recovery at open fsyncs on this thread
        writer.append_many(make_records(100))
        writer.flush()
        assert threads
        assert threading.current_thread() not in threads


def test_close_waits_for_the_syncer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync
    running: list[int] = []
    done: list[int] = []

    def slow_fsync(fd: int) -> None:
        running.append(fd)
        time.sleep(0.02)
        real_fsync(fd)  # fails with EBADF if the fd was closed under it
        done.append(fd)

    writer = JournalWriter.open(tmp_path, fsync_every=4)
    monkeypatch.setattr(os, "fsync", slow_fsync)
    writer.append_many(make_records(10))
    assert writer.durable_seq < 10  # the fsyncs are still running or queued
    writer.close()
    assert running and len(done) == len(running)
    assert writer.durable_seq == 10
    assert not journal_threads()
    assert replay(tmp_path).records == make_records(10)


def failing_fsync(fd: int) -> None:
    raise OSError(errno.EIO, "injected")


def test_background_fsync_error_surfaces_on_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = JournalWriter.open(tmp_path, fsync_every=4)
    writer.append_many(make_records(3))
    writer.flush()
    monkeypatch.setattr(os, "fsync", failing_fsync)
    writer.append_many(make_records(4, start=4))  # the batch 1..4 is due: background fsync
    # The syncer fails some time after that append; the next append to notice raises.
    deadline = time.monotonic() + 5
    with pytest.raises(OSError, match="injected") as info:
        while time.monotonic() < deadline:
            writer.append(["probe"])
            time.sleep(0.001)
    assert info.value.errno == errno.EIO
    appended = writer.last_seq
    # Sticky: a failed fsync is never retried (it could "succeed" after the pages were lost).
    with pytest.raises(OSError, match="injected"):
        writer.flush()
    assert writer.durable_seq == 3
    with pytest.raises(OSError, match="injected"):
        writer.close()
    assert writer.closed
    assert not journal_threads()
    monkeypatch.undo()
    # The fds and the lock were released; what was written is still there.
    with JournalWriter.open(tmp_path) as reopened:
        assert reopened.last_seq == appended
    assert replay(tmp_path).last_seq == appended


def test_flush_raises_a_background_fsync_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = JournalWriter.open(tmp_path, fsync_every=2)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    writer.append_many(make_records(2))
    with pytest.raises(OSError, match="injected") as info:
        writer.flush()
    assert info.value.errno == errno.EIO
    with pytest.raises(OSError, match="injected"):
        writer.append([3])
    assert writer.last_seq == 2  # the refused append took no seq
    with pytest.raises(OSError, match="injected"):
        writer.close()
    assert writer.closed


def test_rolling_a_segment_during_a_pending_fsync_is_safe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    wrong: list[str] = []

    def checking_fsync(fd: int) -> None:
        # The fd must name the same file for the whole fsync: not closed, not reused.
        before = os.readlink(f"/proc/self/fd/{fd}")
        time.sleep(0.002)
        real_fsync(fd)
        after = os.readlink(f"/proc/self/fd/{fd}")
        if before != after:
            wrong.append(f"{before} -> {after}")

    monkeypatch.setattr(os, "fsync", checking_fsync)
    # Snapshots come right after a batch was handed off, while its fsync likely still runs.
    with JournalWriter.open(tmp_path, fsync_every=8, snapshot_every=200) as writer:
        append_toy_run(writer, 1000)
    assert not wrong
    assert rebuild(tmp_path) == full_state(1000)
    assert replay(tmp_path).snapshot_seq == 1000


def test_a_crash_between_segment_roll_and_the_last_batch_is_a_torn_tail(tmp_path: Path) -> None:
    """The next segment exists (empty) while the previous one lost its unsynced tail."""
    with JournalWriter.open(tmp_path, background_fsync=False) as writer:
        writer.append_many(make_records(10))
        writer.write_snapshot({"n": 10}, seq=5)
    first = tmp_path / segment_name(1)
    first.write_bytes(first.read_bytes()[:-3])  # record 10 torn
    found = replay(tmp_path)
    assert (found.snapshot_seq, found.last_seq) == (5, 9)
    with JournalWriter.open(tmp_path) as writer:  # resumes after record 9
        assert writer.append([11]) == 10
    assert replay(tmp_path).last_seq == 10


def test_submit_hands_records_off_and_reports_progress(tmp_path: Path) -> None:
    woken = threading.Event()
    writer = JournalWriter.open(
        tmp_path, fsync_every=1000, fsync_interval_s=60.0, on_progress=woken.set
    )
    with writer:
        seq = writer.append(["a"])
        assert writer.written_seq == writer.durable_seq == 0  # still buffered
        writer.submit()
        assert woken.wait(10)
        deadline = time.monotonic() + 10
        while writer.durable_seq < seq and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.written_seq == writer.durable_seq == seq
    assert replay(tmp_path).records == [["a"]]


# ------------------------------------------------- writes on the appending thread, fsyncs off it


def test_a_write_does_not_wait_for_a_running_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    release = threading.Event()
    started = threading.Event()

    def stuck_fsync(fd: int) -> None:
        started.set()
        assert release.wait(10)
        real_fsync(fd)

    with JournalWriter.open(tmp_path, fsync_every=1000, fsync_interval_s=60.0) as writer:
        monkeypatch.setattr(os, "fsync", stuck_fsync)
        writer.append(["a"])
        writer.submit()
        assert started.wait(10)  # the log thread is inside the first batch's fsync
        writer.append(["b"])
        writer.submit()
        # Handed to the OS by the time submit() returns, fsync or not: a reader sees it.
        assert writer.written_seq == 2
        assert replay(tmp_path).records == [["a"], ["b"]]
        assert writer.durable_seq == 0
        release.set()
        writer.flush()
        assert writer.durable_seq == 2


def test_durable_seq_only_covers_writes_made_before_the_fsync_began(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    wrong: list[str] = []
    holder: dict[str, JournalWriter] = {}
    written_at_start = [0]

    def slow_fsync(fd: int) -> None:
        if "w" in holder:
            written_at_start[0] = holder["w"].written_seq
        time.sleep(0.001)
        real_fsync(fd)

    def check() -> None:  # on_progress: right after each fsync, on the log thread
        durable = holder["w"].durable_seq
        if durable > written_at_start[0]:
            wrong.append(f"durable {durable} > written {written_at_start[0]} at fsync start")

    monkeypatch.setattr(os, "fsync", slow_fsync)
    options: dict[str, Any] = {"fsync_every": 5, "snapshot_every": 97, "on_progress": check}
    with JournalWriter.open(tmp_path, **options) as writer:
        holder["w"] = writer
        state: dict[str, Any] = {}
        for i in range(600):
            record = [1, f"k{i % 3}", i]
            writer.append(record)
            apply(state, record)
            if i % 7 == 0:
                writer.submit(durable=i % 2 == 0)
            if writer.needs_snapshot:
                writer.write_snapshot(state)
    assert not wrong, wrong[:3]
    assert rebuild(tmp_path) == full_state(600)


def test_no_record_reaches_a_segment_before_the_previous_one_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records written on the appending thread after a snapshot still wait for the old
    segment: a crash must never leave a gap in one segment and records in the next."""
    from asyncrl.runtime.scheduler.journal import _syncer

    real_fsync, real_write_all = os.fsync, _syncer.write_all
    synced: dict[str, int] = {}  # segment name -> size when its last fsync began
    wrong: list[str] = []

    def name_of(fd: int) -> str:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))

    def recording_fsync(fd: int) -> None:
        name = name_of(fd)
        size = os.fstat(fd).st_size
        time.sleep(0.002)  # let the appending thread run ahead
        real_fsync(fd)
        synced[name] = size

    def checking_write_all(fd: int, data: bytes | bytearray) -> None:
        name = name_of(fd)
        if name.startswith("journal-"):
            earlier = [p for p in segments(tmp_path) if p.name < name]
            if earlier and synced.get(earlier[-1].name) != earlier[-1].stat().st_size:
                wrong.append(f"wrote {name} before {earlier[-1].name} was fsynced")
        real_write_all(fd, data)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(_syncer, "write_all", checking_write_all)
    with JournalWriter.open(tmp_path, fsync_every=4, snapshot_every=50) as writer:
        state: dict[str, Any] = {}
        for i in range(400):
            record = [1, f"k{i % 3}", i]
            writer.append(record)
            apply(state, record)
            writer.submit(durable=False)
            if writer.needs_snapshot:
                writer.write_snapshot(state)
    assert not wrong, wrong[:3]
    assert rebuild(tmp_path) == full_state(400)


def test_submit_without_durable_writes_now_and_fsyncs_within_the_interval(
    tmp_path: Path,
) -> None:
    woken = threading.Event()
    with JournalWriter.open(
        tmp_path, fsync_every=1000, fsync_interval_s=0.3, on_progress=woken.set
    ) as writer:
        start = time.monotonic()
        seq = writer.append(["a"])
        writer.submit(durable=False)
        assert writer.written_seq == seq
        assert writer.durable_seq == 0  # not yet: the fsync waits for more writes to join
        assert woken.wait(10)
        assert writer.durable_seq == seq
        assert time.monotonic() - start >= 0.25
        assert writer.stats.fsyncs == 1


def test_a_lazy_fsync_joins_the_next_one_and_flush_does_not_wait_for_it(
    tmp_path: Path,
) -> None:
    with JournalWriter.open(tmp_path, fsync_every=3, fsync_interval_s=60.0) as writer:
        writer.append(["a"])
        writer.submit(durable=False)
        writer.append(["b"])
        writer.submit(durable=False)
        assert writer.durable_seq == 0
        writer.append(["c"])
        writer.submit(durable=False)  # a batch's worth unsynced: fsynced at once
        deadline = time.monotonic() + 10
        while writer.durable_seq < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert (writer.durable_seq, writer.stats.fsyncs) == (3, 1)
        writer.append(["d"])
        writer.submit(durable=False)
        start = time.monotonic()
        writer.flush()
        assert time.monotonic() - start < 30
        assert writer.durable_seq == 4
