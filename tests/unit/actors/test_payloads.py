"""Role payloads survive the wire and say clearly when something is missing."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.actors.payloads import LogprobsOut, PayloadError, PromptIn, RewardsOut, RolloutsOut
from asyncrl.actors.tasks import Sample
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p


def over_the_wire(item: p.Item) -> p.Item:
    lease = p.Lease(1, 1, "train", 5.0, 0, (item,))
    decoded = p.decode(p.encode(lease))
    assert isinstance(decoded, p.Lease)
    return decoded.items[0]


def test_every_role_payload_round_trips_through_the_protocol() -> None:
    rollouts = RolloutsOut.stack(
        [5, 6, 7], [([3, 4, 1], [-0.5, -0.25, -0.1], [2, 3, 3], False), ([9], [-2.0], [2], True)]
    )
    item = p.Item(
        7,
        "train-000000007",
        {
            Role.DATALOADER.value: PromptIn(7, "1+2=", "3").to_payload(),
            Role.GENERATE.value: rollouts.to_payload(),
            Role.LOGP.value: LogprobsOut(np.zeros((2, 3), np.float32), 3).to_payload(),
            Role.REF_LOGP.value: LogprobsOut(np.ones((2, 3), np.float32), None).to_payload(),
            Role.REWARD.value: RewardsOut(np.array([1.0, 0.0], np.float32)).to_payload(),
        },
    )
    got = over_the_wire(item)
    assert PromptIn.of(got) == PromptIn(7, "1+2=", "3")
    back = RolloutsOut.of(got)
    assert back.responses() == [[3, 4, 1], [9]]
    assert back.behaviour() == (2, 3)  # the padding's zeros are not a version
    assert back.truncated.tolist() == [0, 1]
    assert LogprobsOut.of(got, Role.LOGP).version == 3
    assert LogprobsOut.of(got, Role.REF_LOGP).version is None
    assert RewardsOut.of(got).rewards.tolist() == [1.0, 0.0]


def test_a_missing_or_mistyped_field_names_the_group_and_field() -> None:
    item = p.Item(1, "k1", {Role.REWARD.value: {"rewards": np.zeros(2, np.float64)}})
    with pytest.raises(PayloadError, match=r"'k1'.*generate\.prompt_ids"):
        RolloutsOut.of(item)
    with pytest.raises(PayloadError, match=r"reward\.rewards is not a 1-d float32"):
        RewardsOut.of(item)


def test_reward_parts_round_trip_and_sum_to_the_reward() -> None:
    out = RewardsOut.summed(
        {"task": np.array([1.0, 0.0, 1.0]), "overlong": np.array([0.0, -0.25, -1.0])}
    )
    assert out.rewards.dtype == np.float32 and out.rewards.tolist() == [1.0, -0.25, 0.0]
    got = RewardsOut.of(over_the_wire(p.Item(3, "k3", {Role.REWARD.value: out.to_payload()})))
    assert got.rewards.tolist() == [1.0, -0.25, 0.0]
    assert {name: part.tolist() for name, part in got.parts.items()} == {
        "task": [1.0, 0.0, 1.0],
        "overlong": [0.0, -0.25, -1.0],
    }


def test_a_reward_payload_without_parts_is_all_task_reward() -> None:
    rewards = np.array([0.5, 1.0], np.float32)
    got = RewardsOut.of(p.Item(1, "k1", {Role.REWARD.value: {"rewards": rewards}}))
    assert list(got.parts) == ["task"] and got.parts["task"].tolist() == [0.5, 1.0]
    assert list(RewardsOut(rewards).parts) == ["task"]


def test_a_reward_part_of_another_shape_or_type_is_refused() -> None:
    rewards = np.zeros(2, np.float32)
    for parts in ({"overlong": np.zeros(3, np.float32)}, {"task": np.zeros(2)}, {}, [1]):
        item = p.Item(1, "k1", {Role.REWARD.value: {"rewards": rewards, "parts": parts}})
        with pytest.raises(PayloadError, match=r"'k1'.*reward\.parts"):
            RewardsOut.of(item)


def test_a_data_file_rows_source_and_extras_reach_the_reward_functions_sample() -> None:
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"})
    sample = Sample("What is 2+2?", "4", "my_math", {"id": 7, "tags": ["easy"]}, messages)
    item = p.Item(1, "k", {Role.DATALOADER.value: PromptIn.from_sample(3, sample).to_payload()})
    back = PromptIn.of(over_the_wire(item))
    assert back.index == 3 and back.sample() == sample
    # A task plug-in's samples have neither: the payload stays as it was.
    plain = PromptIn.from_sample(0, Sample("1+2=", "3")).to_payload()
    assert set(plain) == {"index", "prompt", "answer"}
