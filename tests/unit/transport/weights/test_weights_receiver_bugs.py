"""A receiver whose background job raises (a bug) asks for a plan again, and the next
plan loads, instead of waiting forever for an outcome that will not come."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.transport.weights.base import NeedsPlan, Received, WeightsPlan
from asyncrl.transport.weights.shm import ShmPublisher, ShmReceiver
from asyncrl.transport.weights.ucx import UcxPublisher, UcxReceiver
from asyncrl.transport.weights.ucx.fetch import Fetch
from tests.unit.transport.weights.test_weights_shm import receive, state


def broken(*_: object) -> Any:
    raise RuntimeError("a bug in the job")


def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    receiver = ShmReceiver()
    monkeypatch.setattr(receiver, "_bad_buckets", broken)  # the check raises
    return ShmPublisher(tmp_path / "slots", bucket_mb=1 / 1024), receiver


def ucx(_tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    monkeypatch.setattr(Fetch, "run", broken)  # the fetch raises
    return UcxPublisher(bucket_mb=1 / 1024), UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=5)


@pytest.mark.parametrize("strategy", [shm, ucx], ids=["shm check", "ucx fetch"])
def test_a_job_that_raises_is_a_request_for_a_plan_and_the_next_one_loads(
    strategy: Callable[..., tuple[Any, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher, receiver = strategy(tmp_path, monkeypatch)
    announcement = publisher.publish(1, state(1))
    plan = WeightsPlan(1, announcement.manifest, "trainer", announcement.address)
    got = receive(receiver, plan)
    assert isinstance(got, NeedsPlan) and "a bug in the job" in got.reason
    assert receiver.target is None
    monkeypatch.undo()
    got = receive(receiver, plan)
    assert isinstance(got, Received)
    assert all(torch.equal(got.state[n], t) for n, t in state(1).items())
    receiver.close()
    publisher.close()
