"""Shared-memory slot files in one process: headers, locks, the sweep, kept maps, and the
refusals a receiver gives for plans it cannot use."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import torch

from asyncrl.transport.weights.base import MAPPED, NeedsPlan, Received, WeightsPlan
from asyncrl.transport.weights.shm import ShmPublisher, ShmReceiver, ram_directory, sweep
from asyncrl.transport.weights.shm.slot_file import (
    Gone,
    MapCache,
    MappedVersion,
    NoSpace,
    SlotFile,
    decode_address,
    encode_address,
)
from tests.support import hostile


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "slots"


@pytest.fixture
def publisher(directory: Path) -> Iterator[ShmPublisher]:
    made = ShmPublisher(directory, bucket_mb=1 / 1024)  # 1 KiB buckets: several per version
    yield made
    made.close()


def state(version: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((300,), float(version)), "b": torch.arange(7) + version}


def receive(receiver: ShmReceiver, plan: WeightsPlan) -> Received | NeedsPlan:
    receiver.want(plan)
    deadline = time.monotonic() + 10
    while (outcome := receiver.poll()) is None:
        assert time.monotonic() < deadline, "no outcome in 10 s"
        time.sleep(0.001)
    return outcome


def plan_of(publisher: ShmPublisher, version: int) -> WeightsPlan:
    announcement = publisher.publish(version, state(version))
    return WeightsPlan(version, announcement.manifest, "trainer", announcement.address)


def test_a_version_round_trips_through_a_slot_file(publisher: ShmPublisher) -> None:
    receiver = ShmReceiver()
    got = receive(receiver, plan_of(publisher, 1))
    assert isinstance(got, Received)
    for name, tensor in state(1).items():
        assert torch.equal(got.state[name], tensor)
    receiver.close()


def test_a_mapped_version_says_it_was_mapped_whichever_source_the_plan_named(
    publisher: ShmPublisher,
) -> None:
    receiver = ShmReceiver()
    announcement = publisher.publish(1, state(1))
    plan = WeightsPlan(1, announcement.manifest, "generate-1", announcement.address)  # a relay
    got = receive(receiver, plan)
    assert isinstance(got, Received) and got.source == MAPPED
    receiver.close()


def test_the_trainer_reuses_a_file_once_its_reader_moved_on(
    publisher: ShmPublisher, directory: Path
) -> None:
    receiver = ShmReceiver()
    for version in range(1, 6):
        got = receive(receiver, plan_of(publisher, version))
        assert isinstance(got, Received)
        receiver.loaded(got)
    assert len(list(directory.glob("*.weights"))) == 2
    receiver.close()


def test_a_file_being_written_or_holding_another_version_is_gone(directory: Path) -> None:
    directory.mkdir()
    slot = SlotFile(directory / "1-0.weights", 64)  # locked for writing from the start
    slot.begin(64)
    with pytest.raises(Gone, match="being rewritten"):
        MappedVersion(slot.path, 3, 64, MapCache())
    slot.finish(3, 64)
    with pytest.raises(Gone, match="holds version 3"):
        MappedVersion(slot.path, 4, 64, MapCache())
    mapped = MappedVersion(slot.path, 3, 64, MapCache())
    assert not slot.try_lock()  # pinned by the reader
    mapped.release()
    assert slot.try_lock()
    slot.remove()
    with pytest.raises(Gone, match="is gone"):
        MappedVersion(slot.path, 3, 64, MapCache())


def test_sweep_removes_only_files_nobody_holds(directory: Path) -> None:
    directory.mkdir()
    held, free = SlotFile(directory / "1-0.weights", 64), SlotFile(directory / "1-1.weights", 64)
    held.begin(64)
    held.finish(2, 64)
    free.abandon()
    mapped = MappedVersion(held.path, 2, 64, MapCache())
    (directory / "notes.txt").write_text("not a slot file")
    assert sweep(directory) == 1
    assert sorted(p.name for p in directory.iterdir()) == ["1-0.weights", "notes.txt"]
    mapped.release()
    assert sweep(directory) == 1
    assert sweep(directory / "missing") == 0


def test_a_kept_map_is_reused_for_the_same_file_and_dropped_when_it_is_replaced(
    directory: Path,
) -> None:
    directory.mkdir()
    maps = MapCache()
    slot = SlotFile(directory / "1-0.weights", 64)
    slot.finish(1, 64)
    first = MappedVersion(slot.path, 1, 64, maps)
    first.release()
    assert slot.try_lock()
    slot.begin(64)
    slot.finish(2, 64)
    second = MappedVersion(slot.path, 2, 64, maps)
    assert second._map is first._map  # the same pages, already mapped
    second.release()
    slot.remove()
    again = SlotFile(directory / "1-0.weights", 64)  # same name, another file
    again.finish(3, 64)
    third = MappedVersion(again.path, 3, 64, maps)
    assert third._map is not first._map
    third.release()
    again.remove()


def test_a_plan_from_another_host_is_refused_naming_both(publisher: ShmPublisher) -> None:
    plan = plan_of(publisher, 1)
    elsewhere = msgpack.packb({"host": "other-host/boot", "dir": str(publisher.directory)})
    manifest = {**plan.manifest, "shm": elsewhere}
    with pytest.raises(ValueError, match=r"on host 'other-host/boot'.*use ucx"):
        ShmReceiver().want(WeightsPlan(1, manifest, "trainer", plan.source_address))


@pytest.mark.parametrize("name", ["../../etc/passwd", "1-0.weights/..", "", None, 7])
def test_a_file_name_that_is_not_a_slot_files_is_refused(
    publisher: ShmPublisher, name: object
) -> None:
    plan = plan_of(publisher, 1)
    manifest = {**plan.manifest, "file": name}
    with pytest.raises(ValueError, match="not a slot file's"):
        ShmReceiver().want(WeightsPlan(1, manifest, "trainer", plan.source_address))


def test_a_plan_from_a_trainer_with_another_strategy_says_so(publisher: ShmPublisher) -> None:
    plan = plan_of(publisher, 1)
    manifest = {k: v for k, v in plan.manifest.items() if k != "file"}  # as ucx publishes
    with pytest.raises(ValueError, match=r"another weights\.strategy"):
        ShmReceiver().want(WeightsPlan(1, manifest, "trainer", plan.source_address))


@pytest.mark.parametrize(
    "address, problem",
    [
        (b"\xc1", "not a shared-memory weight address"),
        (msgpack.packb({"host": "h"}), "not a shared-memory weight address"),
        (msgpack.packb({"host": 1, "dir": "/x"}), "must be strings"),
        (msgpack.packb({"host": "h", "dir": "relative"}), "not absolute"),
        (msgpack.packb({"host": "h", "dir": "/dev/shm/a\0b"}), "holds a NUL"),
    ],
)
def test_a_malformed_address_is_an_error_naming_the_problem(address: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        decode_address(address)


def test_every_hostile_value_in_an_address_is_taken_or_a_value_error() -> None:
    address = {"host": "h", "dir": "/dev/shm/x"}
    for path in ((), ("host",), ("dir",)):
        for raw in hostile.HOSTILE:
            with contextlib.suppress(ValueError):
                decode_address(hostile.packed(address, path, raw))


def test_an_address_names_this_host_and_the_directory(directory: Path) -> None:
    host, where = decode_address(encode_address(directory))
    assert where == directory and "/" in host


def test_the_ram_directory_is_one_per_run(tmp_path: Path) -> None:
    a, b = ram_directory(tmp_path / "run-a"), ram_directory(tmp_path / "run-b")
    assert a is not None and b is not None  # this machine has a writable /dev/shm
    assert a != b and a == ram_directory(tmp_path / "run-a")


def test_the_end_of_a_local_run_removes_what_a_killed_trainer_left(tmp_path: Path) -> None:
    from asyncrl.runtime.contract.config import config_from_dict
    from asyncrl.runtime.launch.node import _release_shared_weights

    shm_dir = tmp_path / "shm"
    cfg = config_from_dict(
        {
            "run": {"dir": str(tmp_path / "run")},
            "weights": {"strategy": "shm", "shm_dir": str(shm_dir)},
        }
    )
    shm_dir.mkdir()
    left = SlotFile(shm_dir / "4242-0.weights", 64)
    left.finish(7, 64)
    os.close(left.fd)  # as a trainer killed with SIGKILL leaves it: on disk, nobody holding it
    _release_shared_weights(cfg)
    assert not shm_dir.exists()


def test_a_directory_without_room_for_a_version_is_a_clear_error_not_a_crash(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full tmpfs answers fallocate with ENOSPC (a container's 64 MiB /dev/shm does);
    # writing the pages instead would have killed the trainer with SIGBUS.
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    publisher = ShmPublisher(directory)
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(NoSpace, match=r"needs \d+ MiB in .*shm_dir.*strategy=ucx"):
        publisher.publish(1, state(1))
    assert not list(directory.glob("*.weights"))  # nothing half-made left behind
    monkeypatch.undo()
    receiver = ShmReceiver()
    assert isinstance(receive(receiver, plan_of(publisher, 2)), Received)
    receiver.close()
    publisher.close()
