"""A version in parts over real UCX, in one process: each "rank" stages and serves its own
rows with a publisher of its own; a receiver fetches every part from its publisher and
hands over the whole tensors, a version at a time; a part that fails fails the version,
and the version before stays the one held. A receiver relays each part it holds, so
another fetches the version from it as from the ranks."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from asyncrl.transport.weights.base import NeedsPlan, Received, WeightsPlan
from asyncrl.transport.weights.layout import ManifestError
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


def parts_receiver(relay: bool) -> PartsReceiver:
    return PartsReceiver(
        [
            UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=STALL_S, relay=relay)
            for _ in range(RANKS)
        ]
    )


@pytest.fixture
def ends() -> Iterator[tuple[list[UcxPublisher], PartsReceiver]]:
    publishers = [UcxPublisher(bucket_mb=1 / 1024) for _ in range(RANKS)]
    receiver = parts_receiver(relay=False)
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
        assert receiver.address == b""  # its parts' receivers relay nothing
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
    assert got.version == 2 and got.failed == "train-0"
    assert got.reason.startswith("part 1 from train-0/part-1: ")
    assert receiver.target is None
    # What the model runs on is the version before, whole and untouched.
    for name, tensor in whole(1).items():
        assert torch.equal(held.state[name], tensor)


def test_a_version_whole_or_in_other_parts_is_refused_saying_why(
    ends: tuple[list[UcxPublisher], PartsReceiver],
) -> None:
    publishers, receiver = ends
    plan = publish(publishers, 1)
    for manifest, came in (
        (plan.manifest["parts"][0], "whole"),
        (dict(plan.manifest, parts=plan.manifest["parts"] * 2), "in 4 parts"),
    ):
        with pytest.raises(ManifestError, match=f"version 1 came {came}; this worker takes "
                           "versions in 2 parts"):  # fmt: skip
            receiver.want(WeightsPlan(1, manifest, "train-0", plan.source_address))


def test_a_receiver_relays_each_part_and_a_failed_part_comes_from_the_relay() -> None:
    publishers = [UcxPublisher(bucket_mb=1 / 1024) for _ in range(RANKS)]
    relay, follower = parts_receiver(relay=True), parts_receiver(relay=False)
    try:
        first = publish(publishers, 1)
        relay.want(first)
        assert isinstance(outcome(relay), Received)
        # The follower fetches version 1 from the relay alone: the ranks are not asked.
        assert relay.address
        follower.want(WeightsPlan(1, first.manifest, "gen-0", relay.address))
        got = outcome(follower)
        assert isinstance(got, Received) and got.source == "gen-0", got
        assert all(torch.equal(got.state[n], t) for n, t in whole(1).items())
        served = [part.server.served_bytes for part in relay.parts]  # type: ignore[attr-defined]
        assert all(served), served

        # Version 2: the relay has it whole; rank 1 dies before the follower fetched its
        # part. The follower's part from rank 0 stays; part 1 comes from the relay.
        second = publish(publishers, 2)
        relay.want(second)
        assert isinstance(outcome(relay), Received)
        publishers[1].close()
        follower.want(second)
        failed = outcome(follower, STALL_S + 20)
        assert isinstance(failed, NeedsPlan) and failed.failed == "train-0", failed
        follower.want(WeightsPlan(2, second.manifest, "gen-0", relay.address))
        got = outcome(follower)
        assert isinstance(got, Received) and got.version == 2, got
        assert got.attempts == 2
        assert all(torch.equal(got.state[n], t) for n, t in whole(2).items())
    finally:
        follower.close()
        relay.close()
        for publisher in publishers:
            publisher.close()
