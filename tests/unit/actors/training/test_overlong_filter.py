"""Overlong filtering: a truncated trajectory's tokens leave the step's loss and its token
and sequence counts, while its reward still counts in its group's advantages; and the
step's entropy is measured over the tokens trained."""

from __future__ import annotations

import numpy as np
import torch

from asyncrl.actors.payloads import RolloutsOut, Sampled
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.actors.training.overlong_filter import without_truncated
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.contract.stages import Role
from tests.integration.test_train_group import _lease


def _groups(truncated: dict[int, list[int]], rewards: dict[int, list[float]] | None = None):
    """The test lease's 3 groups of 4, with these rows truncated (and rewards) per group."""
    items = _lease(seed=3, groups=3, responses=4).items
    for gid, item in enumerate(items):
        for row in truncated.get(gid, []):
            item.data[Role.GENERATE.value]["truncated"][row] = 1
        if rewards and gid in rewards:
            item.data[Role.REWARD.value]["rewards"] = np.array(rewards[gid], np.float32)
    return [Group.of(item) for item in items]


def test_truncated_rows_leave_with_their_advantages_and_an_all_truncated_group_leaves() -> None:
    groups = _groups({0: [1, 3], 2: [0, 1, 2, 3]})
    advantages = [
        np.broadcast_to(np.arange(4.0)[:, None] + 10 * i, g.rollouts.response_ids.shape).copy()
        for i, g in enumerate(groups)
    ]
    kept, kept_advantages = without_truncated(groups, advantages)
    assert [g.gid for g in kept] == [0, 1]
    assert kept[0].rollouts.lengths.tolist() == groups[0].rollouts.lengths[[0, 2]].tolist()
    assert kept_advantages[0][:, 0].tolist() == [0.0, 2.0]  # rows 0 and 2 keep theirs
    assert kept[1] is groups[1] and kept_advantages[1] is advantages[1]
    for group, advantage in zip(kept, kept_advantages, strict=True):
        assert advantage.shape == group.rollouts.response_ids.shape


def test_every_sequence_of_a_truncated_trajectory_leaves() -> None:
    def sequence(owner: int, truncated: bool) -> Sampled:
        return Sampled(
            [1, 2, 3], [0.0, -0.1, -0.2], [0, 0, 0], [False, True, True], truncated, owner
        )

    # trajectory 0 is a harness session of two calls, its second cut off; trajectory 1 ended
    rollouts = RolloutsOut.from_sequences(
        [sequence(0, False), sequence(0, True), sequence(1, False)], [1.0, 0.0]
    )
    group = Group(0, rollouts, None, None, np.array([1.0, 0.0], np.float32))
    kept, _ = without_truncated([group], [np.zeros((3, 2), np.float32)])
    assert kept[0].rollouts.owners.tolist() == [1]


def _step(groups: list[Group], **algorithm):
    torch.manual_seed(0)
    model, codec = load_model("embedded")
    cfg = config_from_dict({"algorithm": {"lr": 1e-3, "micro_batch_groups": 1, **algorithm}})
    learner = Learner(model, cfg, codec.pad_id)
    stats = learner.step(groups)
    return stats, {n: t.detach().clone() for n, t in learner.model.named_parameters()}


def test_a_truncated_rows_tokens_do_not_count_but_its_reward_does() -> None:
    truncated = {0: [1], 1: [2, 3]}
    base, base_weights = _step(_groups(truncated), overlong_filter=True)
    assert base.metrics["overlong_filtered_frac"] == 3 / 12
    assert 0.0 < base.metrics["entropy"] < np.log(32)  # nats per token; 32 tokens in all
    groups = _groups(truncated)
    cut = sum(int(g.rollouts.lengths[g.rollouts.truncated != 0].sum()) for g in groups)
    assert base.tokens == sum(g.rollouts.trained_tokens() for g in groups) - cut
    # Other tokens and log-probs on the truncated rows: the same step.
    other = _groups(truncated)
    for g in other:
        g.rollouts.response_ids[g.rollouts.truncated != 0] = 7
        g.rollouts.logprobs[g.rollouts.truncated != 0] = -3.0
    same, same_weights = _step(other, overlong_filter=True)
    assert same.metrics["loss"] == base.metrics["loss"]
    for name, weight in base_weights.items():
        assert torch.equal(weight, same_weights[name]), name
    # Another reward on a truncated row moves its group's baseline: another step.
    rewards = _groups({})[0].rewards.tolist()
    rewards[1] = 1.0 - rewards[1]
    moved, _ = _step(_groups(truncated, {0: rewards}), overlong_filter=True)
    assert moved.metrics["loss"] != base.metrics["loss"]
    # Without the filter the truncated rows are trained like any.
    unfiltered, _ = _step(_groups(truncated))
    assert "overlong_filtered_frac" not in unfiltered.metrics
    assert unfiltered.tokens > base.tokens


def test_a_step_of_truncated_responses_only_changes_nothing() -> None:
    torch.manual_seed(0)
    model, codec = load_model("embedded")
    before = {n: t.detach().clone() for n, t in model.named_parameters()}
    cfg = config_from_dict({"algorithm": {"overlong_filter": True}})
    stats = Learner(model, cfg, codec.pad_id).step(_groups({g: [0, 1, 2, 3] for g in range(3)}))
    expected = {"loss": 0.0, "lr": 2e-4, "updates": 0, "overlong_filtered_frac": 1.0}
    assert stats.metrics == expected and stats.tokens == 0
    for name, weight in model.named_parameters():
        assert torch.equal(weight, before[name]), name
