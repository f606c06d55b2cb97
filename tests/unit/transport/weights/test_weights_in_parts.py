"""A version in parts over real UCX, in one process: each "rank" stages and serves its own
rows with a publisher of its own; a receiver fetches every part from its publisher and
hands over the whole tensors, a version at a time; a part that fails fails the version,
and the version before stays the one held."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from asyncrl.transport.weights.base import NeedsPlan, Received, WeightsPlan
from asyncrl.transport.weights.parts import compose
from asyncrl.transport.weights.parts_receiver import PartsReceiver
from asyncrl.transport.weights.ucx import UcxPublisher, UcxReceiver

pytestmark = pytest.mark.timeout(60)

RANKS = 2
STALL_S = 1.0


def whole(version: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(version)
    return {
        "embed.weight": torch.randn(9, 4),
        "norm.weight": torch.randn(5).to(torch.bfloat16),
    }


def parts_of(state: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Each rank's rows, as FSDP2 splits dimension 0."""
    return [
        {name: torch.chunk(t, RANKS)[rank].clone() for name, t in state.items()}
        for rank in range(RANKS)
    ]


@pytest.fixture
def ends() -> Iterator[tuple[list[UcxPublisher], PartsReceiver]]:
    publishers = [UcxPublisher(bucket_mb=1 / 1024) for _ in range(RANKS)]

    def part() -> UcxReceiver:
        return UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=STALL_S, relay=False)

    receiver = PartsReceiver(UcxReceiver(bucket_mb=1 / 1024), part)
    yield publishers, receiver
    receiver.close()
    for publisher in publishers:
        publisher.close()


def publish(publishers: list[UcxPublisher], version: int) -> WeightsPlan:
    state = whole(version)
    parts = [p.publish(version, part) for p, part in zip(publishers, parts_of(state), strict=True)]
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    announced = compose(version, parts, shapes)
    return WeightsPlan(version, announced.manifest, "train-0", announced.address)


def outcome(receiver: PartsReceiver, within_s: float = 20) -> Received | NeedsPlan | None:
    deadline = time.monotonic() + within_s
    while (got := receiver.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return got


def test_every_part_from_its_rank_makes_the_whole_version(
    ends: tuple[list[UcxPublisher], PartsReceiver],
) -> None:
    publishers, receiver = ends
    for version in (1, 2, 3):
        receiver.want(publish(publishers, version))
        assert receiver.address == b""  # it relays no version in parts
        got = outcome(receiver)
        assert isinstance(got, Received), got
        assert got.version == version and got.source == "train-0"
        for name, tensor in whole(version).items():
            assert torch.equal(got.state[name], tensor), (version, name)
        receiver.loaded(got)
        assert receiver.target is None


def test_a_part_whose_rank_is_gone_fails_the_version_and_the_last_stays(
    ends: tuple[list[UcxPublisher], PartsReceiver],
) -> None:
    publishers, receiver = ends
    receiver.want(publish(publishers, 1))
    held = outcome(receiver)
    assert isinstance(held, Received)
    receiver.loaded(held)
    plan = publish(publishers, 2)
    publishers[1].close()  # rank 1 dies before anyone fetched its part
    receiver.want(plan)
    got = outcome(receiver, STALL_S + 20)
    assert isinstance(got, NeedsPlan), got
    assert got.version == 2 and got.failed == "" and got.reason.startswith("part 1 from ")
    assert receiver.target is None
    # What the model runs on is the version before, whole and untouched.
    for name, tensor in whole(1).items():
        assert torch.equal(held.state[name], tensor)
