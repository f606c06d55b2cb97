"""Both ends of a UCX weight transfer gave up on each other, as when the link between
their hosts was cut: the source closed its endpoint to the receiver (its send timed out,
or the slot it read was reused), the receiver closed its own and dials again with a new
one. The source must answer the new one, and go on answering everyone else."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from asyncrl.transport.weights.base import NeedsPlan, Received, WeightsPlan
from asyncrl.transport.weights.ucx import UcxPublisher, UcxReceiver
from asyncrl.transport.weights.ucx.node import UcxNode
from asyncrl.transport.weights.ucx.server import Server
from tests.unit.transport.weights.test_weights_shm import receive, state

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ends() -> Iterator[tuple[UcxPublisher, UcxReceiver]]:
    publisher = UcxPublisher(bucket_mb=1 / 1024)
    receiver = UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=3)
    yield publisher, receiver
    receiver.close()
    publisher.close()


def fetched(publisher: UcxPublisher, receiver: UcxReceiver, version: int) -> Received:
    announcement = publisher.publish(version, state(version))
    plan = WeightsPlan(version, announcement.manifest, "trainer", publisher.address)
    got = receive(receiver, plan)  # type: ignore[arg-type]
    assert isinstance(got, Received), got
    assert all(torch.equal(got.state[n], t) for n, t in state(version).items())
    receiver.loaded(got)
    return got


def test_a_receiver_dialling_again_is_answered_after_the_source_dropped_it(
    ends: tuple[UcxPublisher, UcxReceiver],
) -> None:
    publisher, receiver = ends
    fetched(publisher, receiver, 1)
    publisher.node.drop(receiver.address)  # as after a send to it was cancelled
    receiver.node.drop(publisher.address)  # as after its fetch gave up: a new generation
    fetched(publisher, receiver, 2)
    fetched(publisher, receiver, 3)


def test_the_server_serves_on_after_a_request_it_failed_on(
    ends: tuple[UcxPublisher, UcxReceiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    publisher, receiver = ends
    take, calls = Server._take, []

    def fails_once(self: Server, *args: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug on one request")
        take(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Server, "_take", fails_once)
    announcement = publisher.publish(1, state(1))
    plan = WeightsPlan(1, announcement.manifest, "trainer", publisher.address)
    got = receive(receiver, plan)  # type: ignore[arg-type]
    # The range asked for first was never answered: the fetch gave up on the source ...
    assert isinstance(got, NeedsPlan), got
    # ... which still serves the next attempt.
    got = receive(receiver, plan)  # type: ignore[arg-type]
    assert isinstance(got, Received), got


def test_dropping_a_replaced_endpoint_leaves_its_successor_alone() -> None:
    a, b = UcxNode(), UcxNode()
    try:
        a.endpoint(b.address)
        a.drop(b.address)  # a fetch gave up
        successor = a.endpoint(b.address)
        assert a.generation(b.address) == 1
        a.drop(b.address, generation=0)  # a late failure of a send on the first one
        assert a.endpoint(b.address) is successor
        a.drop(b.address, generation=1)
        assert a.endpoint(b.address) is not successor and a.generation(b.address) == 2
    finally:
        a.close()
        b.close()
