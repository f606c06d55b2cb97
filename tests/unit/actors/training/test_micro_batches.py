"""How the learner cuts a step into micro-batches: rows of like length together, every
row once, and the step's loss and gradient as one micro-batch of everything gives."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.training.learner import MICRO_BATCH_SLACK, Group, Learner
from asyncrl.actors.training.micro_batches import by_length
from asyncrl.runtime.contract.config import config_from_dict
from tests.integration.test_train_group import _lease


def _groups() -> list[Group]:
    return [Group.of(item) for item in _lease(seed=3, groups=6, responses=4).items]


def test_rows_are_cut_longest_first_into_micro_batches_of_like_length() -> None:
    groups = _groups()
    # [rows, longest] per group: row r of group i holds 10 * i + r on every position
    advantages = [
        np.broadcast_to(np.arange(4.0)[:, None] + 10 * i, g.rollouts.response_ids.shape).copy()
        for i, g in enumerate(groups)
    ]
    batches = by_length(groups, advantages, per_micro=2)
    longest = max(len(g.rollouts.prompt_ids) + int(g.rollouts.lengths.max()) for g in groups)
    lengths = []
    seen = []
    for parts, part_advantages in batches:
        here = []
        for part, advantage in zip(parts, part_advantages, strict=True):
            prompt = len(part.rollouts.prompt_ids)
            here += [prompt + int(n) for n in part.rollouts.lengths]
            # each row keeps its own advantage: 10 * group + row
            gid = part.gid
            seen += [(gid, int(a[0]) - 10 * gid) for a in advantage]
            width = part.rollouts.response_ids.shape[1]
            assert advantage.shape == part.rollouts.response_ids.shape
            assert width == int(part.rollouts.lengths.max())  # cut to its longest row
            assert part.proximal.logprobs.shape == part.rollouts.response_ids.shape
        lengths.append(here)
    assert sorted(seen) == [(g.gid, row) for g in groups for row in range(4)]
    for longer, shorter in itertools.pairwise(lengths):
        assert min(longer) >= max(shorter)
    for here in lengths:
        padded = len(here) * max(here)
        # never more padded tokens than 2 groups (8 rows) of the step's longest
        assert padded <= 8 * longest
        assert len(here) == 1 or padded <= MICRO_BATCH_SLACK * sum(here)


def test_a_step_of_one_length_is_cut_by_the_setting_alone() -> None:
    groups = [Group.of(item) for item in _lease(seed=5, groups=6, responses=4).items]
    for g in groups:  # every row 8 tokens, prompt and response
        g.rollouts.lengths[:] = 8 - len(g.rollouts.prompt_ids)
    advantages = [np.zeros(g.rollouts.response_ids.shape) for g in groups]
    batches = by_length(groups, advantages, per_micro=2)
    assert [sum(len(part.rollouts.lengths) for part in parts) for parts, _ in batches] == [8] * 3


def _step(per_micro: int, **algorithm):
    torch.manual_seed(0)
    model, codec = load_model("embedded")
    cfg = config_from_dict(
        {"algorithm": {"micro_batch_groups": per_micro, "lr": 1e-3, **algorithm}}
    )
    learner = Learner(model, cfg, codec.pad_id)
    stats = learner.step(_groups())
    return stats, learner.full_optimizer_state()["state"]


@pytest.mark.parametrize(
    "algorithm",
    [
        {},
        # token advantages whitened over the whole step, and GSPO's per-sequence ratio
        {"estimator": "reinforce_pp", "gamma": 0.9, "ratio": "sequence"},
    ],
    ids=["grpo", "reinforce_pp-gspo"],
)
def test_the_step_is_the_same_however_its_rows_are_cut(algorithm: dict) -> None:
    (cut, cut_state), (whole, whole_state) = _step(1, **algorithm), _step(6, **algorithm)
    assert cut.metrics["loss"] != 0.0
    assert abs(cut.metrics["loss"] - whole.metrics["loss"]) <= 1e-6
    assert abs(cut.grad_norm - whole.grad_norm) <= 1e-5 * whole.grad_norm
    for name, entry in whole_state.items():
        gap = (cut_state[name]["exp_avg"] - entry["exp_avg"]).abs().max()
        assert gap <= 1e-5 * max(float(entry["exp_avg"].abs().max()), 1e-12), name
