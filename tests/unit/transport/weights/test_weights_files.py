"""The files strategy: whole versions appear atomically, old ones are pruned."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.runtime.contract.config import WeightsSection
from asyncrl.transport.weights import (
    NeedsPlan,
    Received,
    WeightDirs,
    WeightsPlan,
    make_publisher,
    make_receiver,
)
from asyncrl.transport.weights.files import FilePublisher, FileReceiver


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(4, 3, generator=g), "b.bias": torch.randn(5, generator=g)}


def fetch(receiver: FileReceiver, version: int) -> Received | NeedsPlan | None:
    receiver.want(WeightsPlan(version, {}, "trainer", b""))
    return receiver.poll()


def test_a_published_version_is_received_byte_exact(tmp_path: Path) -> None:
    files = WeightsSection(strategy="files")
    dirs = WeightDirs(files=tmp_path, shared=tmp_path / "unused")
    publisher, receiver = make_publisher(files, dirs), make_receiver(files, dirs)
    announcement = publisher.publish(3, state(3))
    assert announcement.version == 3 and announcement.address == b""
    got = fetch(receiver, 3)
    assert isinstance(got, Received) and got.version == 3
    assert got.nbytes == (12 + 5) * 4
    for name, tensor in state(3).items():
        assert torch.equal(got.state[name], tensor)


def test_old_versions_are_pruned_and_a_plan_for_one_names_its_source_failed(
    tmp_path: Path,
) -> None:
    publisher = FilePublisher(tmp_path, keep=3)
    for version in range(1, 7):
        publisher.publish(version, state(version))
    assert isinstance(fetch(FileReceiver(tmp_path), 3), NeedsPlan)
    assert all(isinstance(fetch(FileReceiver(tmp_path), v), Received) for v in (4, 5, 6))
    assert not list(tmp_path.glob(".*"))  # no staging file left behind


def test_a_damaged_file_is_not_loaded(tmp_path: Path) -> None:
    FilePublisher(tmp_path).publish(1, state(1))
    path = tmp_path / "v00000001.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    got = fetch(FileReceiver(tmp_path), 1)
    assert isinstance(got, NeedsPlan) and got.failed == "trainer"


def test_a_version_older_than_the_loaded_one_is_ignored(tmp_path: Path) -> None:
    publisher, receiver = FilePublisher(tmp_path), FileReceiver(tmp_path)
    publisher.publish(1, state(1))
    publisher.publish(2, state(2))
    got = fetch(receiver, 2)
    assert isinstance(got, Received)
    receiver.loaded(got)
    assert fetch(receiver, 1) is None


def test_an_unknown_strategy_is_named(tmp_path: Path) -> None:
    weights = WeightsSection()
    object.__setattr__(weights, "strategy", "carrier-pigeon")
    with pytest.raises(ValueError, match=r"weights\.strategy='carrier-pigeon'"):
        make_publisher(weights, WeightDirs(files=tmp_path, shared=tmp_path))


def test_a_new_publisher_removes_the_partial_file_a_killed_one_left(tmp_path: Path) -> None:
    partial = tmp_path / ".v00000003.safetensors.4242.tmp"  # killed while writing version 3
    partial.write_bytes(b"\0" * 4096)
    kept = tmp_path / "v00000002.safetensors"
    kept.write_bytes(b"whole")
    FilePublisher(tmp_path)
    assert not partial.exists() and kept.exists()
