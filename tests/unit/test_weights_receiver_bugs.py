"""A receiver whose background job raises (a bug) asks for a plan again, and the next
plan loads, instead of waiting forever for an outcome that will not come."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.transport.weights.base import NeedsPlan, Plan, Received
from asyncrl.transport.weights.shm import ShmPublisher, ShmReceiver
from asyncrl.transport.weights.ucx import UcxPublisher, UcxReceiver
from asyncrl.transport.weights.ucx.fetch import Fetch
from tests.unit.test_weights_shm import receive, state


def test_an_shm_check_that_raises_is_a_request_for_a_plan_and_the_next_one_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher = ShmPublisher(tmp_path / "slots", bucket_mb=1 / 1024)
    announcement = publisher.publish(1, state(1))
    plan = Plan(1, announcement.manifest, "trainer", announcement.address)
    receiver = ShmReceiver()

    def broken(*_: object) -> list[int]:
        raise RuntimeError("a bug in the check")

    monkeypatch.setattr(receiver, "_bad_buckets", broken)
    got = receive(receiver, plan)
    assert isinstance(got, NeedsPlan) and "a bug in the check" in got.reason
    assert receiver.target is None
    monkeypatch.undo()
    assert isinstance(receive(receiver, plan), Received)
    receiver.close()
    publisher.close()


def test_a_ucx_fetch_that_raises_is_a_request_for_a_plan_and_the_next_one_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publisher = UcxPublisher(bucket_mb=1 / 1024)
    announcement = publisher.publish(1, state(1))
    plan = Plan(1, announcement.manifest, "trainer", announcement.address)
    receiver = UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=5)

    def broken(self: object) -> bool:
        raise RuntimeError("a bug in the fetch")

    monkeypatch.setattr(Fetch, "run", broken)
    got = receive(receiver, plan)
    assert isinstance(got, NeedsPlan) and "a bug in the fetch" in got.reason
    assert receiver.target is None
    monkeypatch.undo()
    got = receive(receiver, plan)
    assert isinstance(got, Received)
    assert all(torch.equal(got.state[n], t) for n, t in state(1).items())
    receiver.close()
    publisher.close()
