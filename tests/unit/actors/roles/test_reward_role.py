"""The reward role pays each trajectory its task reward plus the soft overlong
punishment, and says which is which (``RewardsOut.parts``)."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.actors.actor import WorkerContext
from asyncrl.actors.payloads import PromptIn, RewardsOut, RolloutsOut, Sampled
from asyncrl.actors.roles.reward import Reward
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p


def _role(cfg: RunConfig) -> Reward:
    role = Reward()
    context = WorkerContext("reward-0", "reward", cfg, "test", 1.0, 60.0, 1 << 20, 0)
    role.on_start(context)
    return role


def _item(rollouts: RolloutsOut) -> p.Item:
    return p.Item(
        1,
        "k1",
        {
            Role.DATALOADER.value: PromptIn(0, "1+2=", "3").to_payload(),
            Role.GENERATE.value: rollouts.to_payload(),
        },
    )


def _paid(*turns: list[bool], rewards: list[float]) -> RolloutsOut:
    """One sequence per trajectory after a 2-token prompt; True: a model token."""
    sequences = [
        Sampled([1, 2, *[5] * len(t)], [0.0] * (2 + len(t)), [0] * (2 + len(t)), [False] * 2 + t)
        for t in turns
    ]
    return RolloutsOut.from_sequences(
        [
            Sampled(s.tokens, s.logprobs, s.versions, s.trained, owner=i)
            for i, s in enumerate(sequences)
        ],
        rewards,
    )


def test_paid_rewards_get_the_overlong_punishment_of_their_longest_turn() -> None:
    # max_new_tokens 10, buffer 4: punished beyond 6 tokens, -0.5 at 10.
    cfg = config_from_dict(
        {
            "model": {"max_new_tokens": 10},
            "algorithm": {"overlong_buffer": 4, "overlong_penalty": 0.5},
        }
    )
    role = _role(cfg)
    try:
        rollouts = _paid(
            [True] * 6,  # 6 tokens: not punished
            [True] * 8,  # 8: half the buffer, -0.25
            [True] * 5 + [False] * 3 + [True] * 5,  # two turns of 5: not punished
            [True] * 10,  # the whole budget: -0.5
            rewards=[1.0, 1.0, 0.0, 1.0],
        )
        result = role.process(p.Lease(1, 1, "reward", 60.0, 0, (_item(rollouts),))).results[0]
    finally:
        role.on_stop()
    out = RewardsOut.of(p.Item(1, "k1", {Role.REWARD.value: result.data}))
    np.testing.assert_allclose(out.parts["task"], [1.0, 1.0, 0.0, 1.0])
    np.testing.assert_allclose(out.parts["overlong"], [0.0, -0.25, 0.0, -0.5])
    np.testing.assert_allclose(out.rewards, [1.0, 0.75, 0.0, 0.5])


@pytest.mark.parametrize("buffer", [0, 3])
def test_scored_rewards_are_the_task_part_and_off_means_no_overlong_part(buffer: int) -> None:
    cfg = config_from_dict(
        {"model": {"max_new_tokens": 4}, "algorithm": {"overlong_buffer": buffer}}
    )
    role = _role(cfg)
    try:
        answer = role.codec.encode("3")
        rows = [(answer, [-0.1] * len(answer), [0] * len(answer), False)]
        rows.append(([7, 7, 7, 7], [-0.1] * 4, [0] * 4, True))
        rollouts = RolloutsOut.stack([1, 2], rows)
        result = role.process(p.Lease(1, 1, "reward", 60.0, 0, (_item(rollouts),))).results[0]
    finally:
        role.on_stop()
    out = RewardsOut.of(p.Item(1, "k1", {Role.REWARD.value: result.data}))
    if buffer == 0:
        assert list(out.parts) == ["task"]
        return
    # 4 tokens of a budget of 4 with a buffer of 3: the whole penalty, factor 1.
    assert out.parts["overlong"][1] == pytest.approx(-1.0)
    np.testing.assert_allclose(out.rewards, out.parts["task"] + out.parts["overlong"])
