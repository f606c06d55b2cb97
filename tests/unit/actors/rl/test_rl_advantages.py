"""Group advantages against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.rl import GROUP_ESTIMATORS, group_advantages

EPS = 1e-6


def assert_close(actual: torch.Tensor | None, expected: torch.Tensor) -> None:
    """Shape-checked allclose (torch.testing's first call costs seconds of lazy imports)."""
    assert actual is not None and actual.shape == expected.shape, (actual, expected)
    assert torch.allclose(actual, expected.to(actual.dtype), rtol=1e-6, atol=1e-9), (
        actual,
        expected,
    )


# Three groups of four responses: a split group, an all-equal group, one success in four.
REWARDS = torch.tensor(
    [
        [1.0, 0.0, 1.0, 0.0],
        [2.0, 2.0, 2.0, 2.0],
        [0.0, 0.0, 0.0, 1.0],
    ],
    dtype=torch.float64,
)


def test_grpo_standardises_each_group_with_the_population_std() -> None:
    # group 0: mean 0.5, population std 0.5 (the sample std would be 0.577...)
    # group 2: mean 0.25, population std sqrt((3 * 0.25**2 + 0.75**2) / 4) = sqrt(0.1875)
    std2 = math.sqrt(0.1875)
    expected = torch.tensor(
        [
            [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)],
            [0.0, 0.0, 0.0, 0.0],
            [-0.25 / (std2 + EPS)] * 3 + [0.75 / (std2 + EPS)],
        ],
        dtype=torch.float64,
    )
    assert_close(group_advantages(REWARDS, "grpo"), expected)


def test_dr_grpo_only_centres() -> None:
    expected = torch.tensor(
        [
            [0.5, -0.5, 0.5, -0.5],
            [0.0, 0.0, 0.0, 0.0],
            [-0.25, -0.25, -0.25, 0.75],
        ],
        dtype=torch.float64,
    )
    assert_close(group_advantages(REWARDS, "dr_grpo"), expected)


@pytest.mark.parametrize("estimator", GROUP_ESTIMATORS)
def test_all_equal_rewards_give_exact_zeros(estimator: str) -> None:
    advantages = group_advantages(torch.full((2, 5), 0.7), estimator)
    assert torch.equal(advantages, torch.zeros(2, 5))


def test_a_group_of_one_gets_zero_not_nan() -> None:
    assert torch.equal(group_advantages(torch.tensor([[3.0], [-1.0]]), "grpo"), torch.zeros(2, 1))


def test_integer_rewards_are_promoted_to_float() -> None:
    advantages = group_advantages(torch.tensor([[1, 0]]), "dr_grpo")
    assert advantages.dtype == torch.float32
    assert_close(advantages, torch.tensor([[0.5, -0.5]]))


def test_unknown_estimator_is_named_with_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="estimator") as info:
        group_advantages(REWARDS, "ppo")
    assert "'ppo'" in str(info.value)
    assert "'grpo'" in str(info.value) and "'dr_grpo'" in str(info.value)


@pytest.mark.parametrize(
    "rewards",
    [torch.zeros(4), torch.zeros(2, 3, 4), torch.zeros(2, 0)],
    ids=["1d", "3d", "empty-group"],
)
def test_rewards_must_be_groups_by_responses(rewards: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(rewards, "grpo")


def test_non_finite_rewards_are_rejected() -> None:
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([[1.0, math.nan]]), "grpo")
