"""A publisher makes its buffers ahead of the first version when asked to (``prepare``),
and the first publish then uses them instead of making its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.transport.weights.base import Received, WeightsPlan
from asyncrl.transport.weights.files import FilePublisher
from asyncrl.transport.weights.shm import ShmPublisher, ShmReceiver
from asyncrl.transport.weights.ucx import UcxPublisher
from tests.support.weight_nodes import wait_until
from tests.unit.transport.weights.test_weights_shm import receive, state


def slot_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.weights"))


def test_shm_makes_both_slot_files_ahead_and_publishes_into_them(tmp_path: Path) -> None:
    directory = tmp_path / "slots"
    publisher = ShmPublisher(directory, bucket_mb=1 / 1024)
    publisher.prepare(state(0))
    wait_until(lambda: len(slot_files(directory)) == 2, 10, "both slot files made")
    made = slot_files(directory)
    receiver = ShmReceiver()
    for version in (1, 2, 3):
        announcement = publisher.publish(version, state(version))
        plan = WeightsPlan(version, announcement.manifest, "t", announcement.address)
        got = receive(receiver, plan)
        assert isinstance(got, Received)
        assert all(torch.equal(got.state[n], t) for n, t in state(version).items())
        receiver.loaded(got)
    assert slot_files(directory) == made
    receiver.close()
    publisher.close()
    assert not directory.exists()


@pytest.mark.parametrize("map_on_host", [False, True], ids=["private", "slot files"])
def test_ucx_stages_the_first_version_into_the_buffers_made_ahead(
    tmp_path: Path, map_on_host: bool
) -> None:
    directory = tmp_path / "slots"
    publisher = UcxPublisher(bucket_mb=1 / 1024, share_dir=directory if map_on_host else None)
    publisher.prepare(state(0))
    buffers = publisher.store.buffers
    wait_until(lambda: all(b is not None for b in buffers), 10, "both buffers made")
    made = [b.ctypes.data for b in buffers]  # where each slot's bytes are
    publisher.publish(1, state(1))
    publisher.publish(2, state(2))
    assert [b.ctypes.data for b in buffers] == made
    if map_on_host:
        assert len(slot_files(directory)) == 2
    publisher.close()
    assert not directory.exists()


def test_closing_a_publisher_right_after_prepare_leaves_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "slots"
    publisher = UcxPublisher(bucket_mb=1 / 1024, share_dir=directory)
    publisher.prepare(state(0))
    publisher.close()  # waits for the buffers being made, then removes them
    assert not directory.exists()


def test_the_files_strategy_has_nothing_to_prepare(tmp_path: Path) -> None:
    publisher = FilePublisher(tmp_path / "weights")
    publisher.prepare(state(0))
    assert list((tmp_path / "weights").iterdir()) == []
