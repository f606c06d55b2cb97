"""Each estimator of a step against hand-computed values (RLOO, REINFORCE++ and its group
baseline, GAE whitened), on rows that include a multi-turn one with observation tokens.

Expected numbers are written out, or whitened with the plain-Python ``whiten`` below from
written-out lists; never obtained by calling the estimators a second time.
"""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.rl import ESTIMATORS, estimate_advantages, group_advantages

F64 = torch.float64
EPS = 1e-6

# Two groups of two trajectories, one row each:
#   row 0 (group 0, owner 0): model t0 t1, observation t2, model t3 -> 3 model tokens
#   row 1 (group 0, owner 1): model t0                              -> 1
#   row 2 (group 1, owner 0): model t0 t1 t2                        -> 3
#   row 3 (group 1, owner 1): model t0 t1                           -> 2
MASK = torch.tensor(
    [[1, 1, 0, 1], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0]],
    dtype=torch.bool,
)
GROUP = torch.tensor([0, 0, 1, 1])
OWNER = torch.tensor([0, 1, 0, 1])
REWARDS = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64)


def whiten(values: list[float]) -> list[float]:
    """(x - mean) / (population std + 1e-6), in plain Python."""
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + EPS) for v in values]


def on_mask(flat: list[float], mask: torch.Tensor = MASK) -> torch.Tensor:
    """``flat`` (one value per model token, row by row) laid on the mask, 0 elsewhere."""
    out = torch.zeros(mask.shape, dtype=F64)
    out[mask] = torch.tensor(flat, dtype=F64)
    return out


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape, (actual, expected)
    assert torch.allclose(actual.to(F64), expected, rtol=1e-7, atol=1e-9), (actual, expected)


def estimate(estimator: str, mask: torch.Tensor = MASK, **kwargs):
    return estimate_advantages(estimator, REWARDS, GROUP, OWNER, mask, **kwargs)


def test_rloo_leaves_the_scored_response_out_of_its_baseline() -> None:
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]], dtype=F64)
    # group 0, response 0: 1 - mean(0, 1, 0) = 2/3; response 1: 0 - mean(1, 1, 0) = -2/3
    # group 1, response 3: 1 - 0 = 1; the others: 0 - mean(0, 0, 1) = -1/3
    expected = torch.tensor(
        [[2 / 3, -2 / 3, 2 / 3, -2 / 3], [-1 / 3, -1 / 3, -1 / 3, 1.0]], dtype=F64
    )
    assert_close(group_advantages(rewards, "rloo"), expected)


def test_rloo_needs_two_responses() -> None:
    with pytest.raises(ValueError, match="rloo needs at least 2 responses per group, got n=1"):
        group_advantages(torch.tensor([[1.0]]), "rloo")


def test_a_group_estimator_puts_the_trajectory_advantage_on_its_model_tokens() -> None:
    # rloo with n = 2: r_i - r_other: group 0 -> +1, -1; group 1 -> -1, +1
    result = estimate("rloo")
    assert result.returns is None
    assert_close(result.advantages, on_mask([1, 1, 1, -1, -1, -1, -1, 1, 1]))


def test_reinforce_pp_whitens_the_discounted_returns_over_the_step() -> None:
    # gamma 0.5, the reward on each row's last model token, observation t2 of row 0 skipped:
    #   row 0 (reward 1): t3 = 1, t1 = 0.5, t0 = 0.25; rows 1, 2 (reward 0): 0;
    #   row 3 (reward 1): t1 = 1, t0 = 0.5
    returns = [0.25, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0]
    result = estimate("reinforce_pp", gamma=0.5)
    assert_close(result.advantages, on_mask(whiten(returns)))


def test_reinforce_pp_baseline_subtracts_the_group_mean_first() -> None:
    # group means 0.5 and 0.5: rewards become +0.5, -0.5 (group 0) and -0.5, +0.5 (group 1);
    # gamma 1: every model token of a row returns its centred reward
    returns = [0.5, 0.5, 0.5, -0.5, -0.5, -0.5, -0.5, 0.5, 0.5]
    result = estimate("reinforce_pp_baseline", gamma=1.0)
    assert_close(result.advantages, on_mask(whiten(returns)))


def test_gae_whitens_its_advantages_and_keeps_its_returns() -> None:
    values = on_mask([0.5, 0.4, 0.6, 0.3, 0.2, 0.2, 0.2, 0.7, 0.9])
    values[0, 2] = 9.0  # a decoy on the observation token
    # gamma 1, lam 1: A = (the row's reward) - V on every model token
    raw = [0.5, 0.6, 0.4, -0.3, -0.2, -0.2, -0.2, 0.3, 0.1]
    result = estimate("gae", gamma=1.0, lam=1.0, values=values)
    assert_close(result.advantages, on_mask(whiten(raw)))
    assert result.returns is not None
    assert_close(result.returns, on_mask([1, 1, 1, 0, 0, 0, 0, 1, 1]))


def test_an_estimator_that_ignored_the_mask_would_fail_the_hand_computed_test() -> None:
    # With row 0's observation token counted, its returns and the step's whitening change.
    whole = MASK.clone()
    whole[0, 2] = True
    got = estimate("reinforce_pp", mask=whole, gamma=0.5).advantages
    expected = on_mask(whiten([0.25, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0]))
    assert not torch.allclose(got.to(F64), expected, atol=1e-3)


def test_gae_without_values_is_refused() -> None:
    with pytest.raises(ValueError, match="'gae' needs the critic's values"):
        estimate("gae")


def test_an_unknown_estimator_is_named() -> None:
    with pytest.raises(ValueError, match="got 'ppo'"):
        estimate("ppo")


@pytest.mark.parametrize("estimator", [e for e in ESTIMATORS if e != "gae"])
def test_every_estimator_leaves_observation_and_padding_at_zero(estimator: str) -> None:
    advantages = estimate(estimator, gamma=0.5).advantages
    assert torch.equal(advantages[~MASK], torch.zeros(int((~MASK).sum()), dtype=advantages.dtype))
