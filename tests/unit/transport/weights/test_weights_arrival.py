"""A version a receiver is after arrives, or the receiver says why not within its stall
timeout: it never waits with no end for a buffer to come free."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from asyncrl.transport.weights.base import NeedsPlan, Received, WeightsPlan
from asyncrl.transport.weights.ucx import UcxPublisher, UcxReceiver
from tests.unit.transport.weights.test_weights_shm import receive, state

pytestmark = pytest.mark.timeout(60)

STALL_S = 1.0


@pytest.fixture
def ends() -> Iterator[tuple[UcxPublisher, UcxReceiver]]:
    publisher = UcxPublisher(bucket_mb=1 / 1024)
    receiver = UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=STALL_S)
    yield publisher, receiver
    receiver.close()
    publisher.close()


def plan(publisher: UcxPublisher, version: int) -> WeightsPlan:
    announcement = publisher.publish(version, state(version))
    return WeightsPlan(version, announcement.manifest, "trainer", publisher.address)


def outcome(receiver: UcxReceiver, within_s: float) -> Received | NeedsPlan | None:
    deadline = time.monotonic() + within_s
    while (got := receiver.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return got


def test_a_version_not_yet_taken_keeps_its_buffer_and_the_next_fetch_says_so(
    ends: tuple[UcxPublisher, UcxReceiver],
) -> None:
    publisher, receiver = ends
    first = receive(receiver, plan(publisher, 1))
    assert isinstance(first, Received)
    receiver.loaded(first)  # the model runs on one buffer ...
    second = receive(receiver, plan(publisher, 2))
    assert isinstance(second, Received)  # ... and has not taken the version in the other
    receiver.want(plan(publisher, 3))
    started = time.monotonic()
    got = outcome(receiver, STALL_S + 5)
    assert isinstance(got, NeedsPlan), f"no word of version 3 in {STALL_S + 5:g} s: {got}"
    assert time.monotonic() - started < STALL_S + 3
    assert got.version == 3 and got.failed == ""  # no source is to blame
    assert "no buffer free for version 3" in got.reason and "the model's" in got.reason
    assert receiver.target is None  # the follower asks again
    receiver.loaded(second)  # the model takes version 2: version 3 has a buffer now
    third = receive(receiver, plan(publisher, 3))
    assert isinstance(third, Received)
    assert all(torch.equal(third.state[n], t) for n, t in state(3).items())


def test_a_version_fetched_whole_is_still_handed_over_after_a_newer_plan(
    ends: tuple[UcxPublisher, UcxReceiver],
) -> None:
    publisher, receiver = ends
    first = receive(receiver, plan(publisher, 1))
    assert isinstance(first, Received)
    receiver.loaded(first)
    receiver.want(plan(publisher, 2))
    while receiver.target is not None:  # version 2 is whole, not yet polled
        time.sleep(0.005)
    receiver.want(plan(publisher, 3))
    got = outcome(receiver, 10)
    assert isinstance(got, Received) and got.version == 2, got
    receiver.loaded(got)  # which frees the buffer version 3 goes into
    got = outcome(receiver, 10)
    assert isinstance(got, Received) and got.version == 3, got


def test_a_publisher_whose_readers_are_never_cancelled_says_so_instead_of_waiting() -> None:
    publisher = UcxPublisher(bucket_mb=1 / 1024, send_timeout_s=1.0)
    try:
        publisher.publish(1, state(1))
        publisher.publish(2, state(2))
        publisher.server.close()  # nobody is left to cancel the reads of version 1 ...
        with publisher.store.changed:
            assert publisher.store.pool.open_read(1) is not None  # ... and one is under way
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                publisher.publish(3, state(3))
            except RuntimeError as error:
                errors.append(error)

        worker = threading.Thread(target=publish, daemon=True)
        worker.start()
        worker.join(10)
        assert not worker.is_alive(), "publish waited for a buffer with no end"
        (error,) = errors
        assert "no staging buffer came free for version 3 in 1 s" in str(error)
        assert "1 readers" in str(error)
    finally:
        publisher.close()
