"""Slot files behind a UCX publisher's staging buffers, in one process: a slot moves to
another file while a generator holds its old one, spares are reused, and a full /dev/shm
means private memory, never a crash."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from asyncrl.transport.weights.shm.slot_file import MapCache, MappedVersion
from asyncrl.transport.weights.shm.staging_files import StagingFiles
from asyncrl.transport.weights.ucx.store import Store


def stage(files: StagingFiles, slot: int, version: int, nbytes: int = 4096) -> Path:
    buffer = files.writable(slot, nbytes)
    assert buffer is not None
    buffer[:] = version
    name = files.finish(slot, version, nbytes)["file"]
    assert isinstance(name, str)
    return files.directory / name


def no_space(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_slot_reuses_its_file_while_nobody_maps_it(tmp_path: Path) -> None:
    files = StagingFiles(tmp_path / "slots")
    first = stage(files, 0, 1)
    assert files.files == 2  # the other slot's file is made with the first version
    assert stage(files, 0, 3) == first
    other = stage(files, 1, 4)
    assert other != first and files.files == 2
    files.close()
    assert not (tmp_path / "slots").exists()


def test_a_slot_moves_to_another_file_while_a_generator_holds_its_old_one(tmp_path: Path):
    files = StagingFiles(tmp_path / "slots")
    maps = MapCache()
    held_path = stage(files, 0, 1)
    held = MappedVersion(held_path, 1, 4096, maps)
    moved = stage(files, 0, 3)
    assert moved != held_path
    assert np.all(held.buffer == 1)  # the generator's bytes did not change
    other = stage(files, 1, 4)
    assert other not in (held_path, moved)  # the held file is nobody's to write
    held.release()
    assert stage(files, 1, 6) == other  # slot 1's own file is free again
    assert files.files == 3
    again = stage(files, 0, 7)  # slot 0's file is free too: no new file
    assert again == moved and files.files == 3
    maps.clear()
    files.close()


def test_a_spare_nobody_holds_any_more_is_taken_before_a_new_file(tmp_path: Path) -> None:
    files = StagingFiles(tmp_path / "slots")
    maps = MapCache()
    first = stage(files, 0, 1)
    held = MappedVersion(first, 1, 4096, maps)
    second = stage(files, 0, 3)  # first becomes a spare
    pinned = MappedVersion(second, 3, 4096, maps)
    held.release()
    assert stage(files, 0, 5) == first  # the spare, not a third file
    assert files.files == 2
    pinned.release()
    maps.clear()
    files.close()


def test_no_room_in_shared_memory_stages_in_private_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = StagingFiles(tmp_path / "slots")
    store = Store(files)
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    assert store.claim(1, 4096) == 0
    assert not store.in_file[0]
    private = store.buffers[0]
    assert private is not None and private.base is None  # np.empty, not a map
    assert not list((tmp_path / "slots").glob("*.weights"))
    monkeypatch.undo()
    store.pool.finish_write(0)
    assert store.claim(2, 4096) == 1
    assert store.in_file[1]  # room again: a file
    files.close()


def test_a_slot_that_was_in_a_file_never_falls_back_onto_that_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = StagingFiles(tmp_path / "slots")
    store = Store(files)
    maps = MapCache()
    slot = store.claim(1, 4096)
    assert slot == 0 and store.in_file[0]
    path = files.directory / str(files.finish(0, 1, 4096)["file"])
    store.pool.finish_write(0)
    held = MappedVersion(path, 1, 4096, maps)  # a generator runs on version 1
    store.pool.finish_write(store.claim(2, 4096) or 0)
    monkeypatch.setattr(os, "posix_fallocate", no_space)  # and now /dev/shm is full
    assert store.claim(3, 4096) == 0
    assert not store.in_file[0]
    store.buffers[0][:] = 3  # type: ignore[index]
    assert np.all(held.buffer == 0)  # staged zeros of version 1's test buffer, untouched
    held.release()
    maps.clear()
    files.close()
