"""Token-level returns, GAE and whitening against hand-computed values.

Every expected number is written out (with its arithmetic beside it) or derived with plain
``math`` from written-out lists, never by calling the function under test again. The rows
are multi-turn: a model turn, observation tokens (mask 0), a second model turn, padding.
The masked-out positions hold decoys (9.0, 7.0, NaN) that change every result if read.
"""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.rl import discounted_returns, gae, last_token_rewards, masked_whiten

F64 = torch.float64
NAN = math.nan

# Row 0: model tokens t0 t1, observation t2 t3, model tokens t4 t5, padding t6.
# Row 1: one model turn t0..t2, padding after.
MASK = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
# What a loss that ignores the observation mask would see: every position up to the end.
WHOLE_ROWS = torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
VALUES = torch.tensor(
    [[0.5, 0.4, 9.0, 9.0, 0.6, 0.8, NAN], [0.2, 0.3, 0.1, 9.0, 9.0, 9.0, 9.0]], dtype=F64
)
GAMMA, LAM = 0.9, 0.5


def assert_close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    want = torch.tensor(expected, dtype=F64)
    assert actual.shape == want.shape, (actual, want)
    assert torch.allclose(actual.to(F64), want, rtol=1e-9, atol=1e-12), (actual, want)


def rewards_at_the_end() -> torch.Tensor:
    """Row 0 paid 1, row 1 paid 0, each at its last model token; a decoy on row 0's
    observation token t2 that a masked recursion never reads."""
    token = last_token_rewards(torch.tensor([1.0, 0.0], dtype=F64), MASK)
    token[0, 2] = 7.0
    return token


def test_the_reward_lands_on_the_last_model_token() -> None:
    token = last_token_rewards(torch.tensor([1.0, -2.0]), MASK)
    assert_close(token, [[0, 0, 0, 0, 0, 1.0, 0], [0, 0, -2.0, 0, 0, 0, 0]])


def test_discounted_returns_skip_observation_tokens() -> None:
    # gamma 0.5, row 0: G5 = 1, G4 = 0.5, G1 = 0.25 (t4 is t1's next model token), G0 = 0.125
    returns = discounted_returns(rewards_at_the_end(), MASK, 0.5)
    assert_close(returns, [[0.125, 0.25, 0, 0, 0.5, 1.0, 0], [0.0] * 7])


def test_gae_by_hand_on_a_multi_turn_row() -> None:
    advantages, returns = gae(rewards_at_the_end(), VALUES, MASK, GAMMA, LAM)
    # Row 0, gamma * lam = 0.45, the next model token's value (0 after the last):
    #   t5: delta = 1 + 0.9 * 0     - 0.8 =  0.2;   A = 0.2
    #   t4: delta = 0 + 0.9 * 0.8   - 0.6 =  0.12;  A = 0.12 + 0.45 * 0.2    = 0.21
    #   t1: delta = 0 + 0.9 * 0.6   - 0.4 =  0.14;  A = 0.14 + 0.45 * 0.21   = 0.2345
    #   t0: delta = 0 + 0.9 * 0.4   - 0.5 = -0.14;  A = -0.14 + 0.45 * 0.2345 = -0.034475
    # Row 1 (reward 0):
    #   t2: delta = 0 - 0.1 = -0.1;                 A = -0.1
    #   t1: delta = 0.9 * 0.1 - 0.3 = -0.21;        A = -0.21 + 0.45 * -0.1  = -0.255
    #   t0: delta = 0.9 * 0.3 - 0.2 = 0.07;         A = 0.07 + 0.45 * -0.255 = -0.04475
    assert_close(
        advantages,
        [
            [-0.034475, 0.2345, 0, 0, 0.21, 0.2, 0],
            [-0.04475, -0.255, -0.1, 0, 0, 0, 0],
        ],
    )
    # returns = A + V on model tokens
    assert_close(
        returns,
        [
            [0.465525, 0.6345, 0, 0, 0.81, 1.0, 0],
            [0.15525, 0.045, 0.0, 0, 0, 0, 0],
        ],
    )


def test_gae_that_ignored_the_observation_mask_would_fail_the_hand_computed_test() -> None:
    # The same inputs with observation tokens treated as steps: t1's next value would be
    # the decoy 9.0 on t2 and its advantage would differ from the hand-computed 0.2345.
    advantages, _ = gae(rewards_at_the_end(), VALUES, WHOLE_ROWS, GAMMA, LAM)
    assert abs(float(advantages[0, 1]) - 0.2345) > 1.0
    returns = discounted_returns(rewards_at_the_end(), WHOLE_ROWS, 0.5)
    assert float(returns[0, 1]) != 0.25


def test_gae_with_lambda_one_is_the_return_minus_the_value() -> None:
    advantages, returns = gae(rewards_at_the_end(), VALUES, MASK, 1.0, 1.0)
    # undiscounted: every model token of row 0 returns 1, of row 1 returns 0
    assert_close(returns, [[1, 1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0]])
    assert_close(advantages, [[0.5, 0.6, 0, 0, 0.4, 0.2, 0], [-0.2, -0.3, -0.1, 0, 0, 0, 0]])


def test_whitening_uses_the_masked_tokens_of_the_whole_batch() -> None:
    values = torch.tensor([[1.0, 3.0, 100.0], [5.0, NAN, 7.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    # masked values 1, 3, 5, 7: mean 4, population std sqrt((9 + 1 + 1 + 9) / 4) = sqrt(5)
    s = math.sqrt(5.0) + 1e-6
    assert_close(masked_whiten(values, mask), [[-3 / s, -1 / s, 0], [1 / s, 0, 3 / s]])


def test_whitening_equal_values_gives_exact_zeros() -> None:
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    assert torch.equal(masked_whiten(torch.full((1, 3), 0.3), mask), torch.zeros(1, 3))


@pytest.mark.parametrize("name, value", [("gamma", 1.5), ("lam", -0.1)])
def test_out_of_range_discount_is_named(name: str, value: float) -> None:
    kwargs = {"gamma": GAMMA, "lam": LAM, name: value}
    with pytest.raises(ValueError, match=f"{name} must be in \\[0, 1\\], got {value}"):
        gae(rewards_at_the_end(), VALUES, MASK, **kwargs)


def test_a_mask_of_another_shape_is_rejected() -> None:
    with pytest.raises(ValueError, match="shape"):
        gae(rewards_at_the_end(), VALUES[:, :3], MASK, GAMMA, LAM)
