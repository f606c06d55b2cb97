"""GSPO's sequence-level ratio and per-token advantages in the policy loss, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.rl import LossConfig, policy_loss

F64 = torch.float64
GSPO = LossConfig(clip_low=0.2, clip_high=0.28, ratio="sequence")
TOKEN = LossConfig(clip_low=0.2, clip_high=0.28, ratio="token")

# Row 0: log ratios 0.2 and -0.1 on its two tokens (then padding); mean 0.05, inside the
#        clip range [0.8, 1.28] as a sequence (token by token too: e^0.2 = 1.22, e^-0.1 = 0.90).
# Row 1: log ratios 0.5 and 0.4; mean 0.45, e^0.45 = 1.568 > 1.28: clipped for A > 0.
PROXIMAL = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]], dtype=F64)
LOG_RATIO = torch.tensor([[0.2, -0.1, math.nan], [0.5, 0.4, math.nan]], dtype=F64)
MASK = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)


def run(cfg: LossConfig, advantages: torch.Tensor):
    logp = (PROXIMAL + LOG_RATIO).clone().requires_grad_(True)
    loss, stats = policy_loss(
        logp,
        PROXIMAL,
        PROXIMAL,
        advantages,
        MASK,
        cfg,
        total_tokens=4.0,
        total_sequences=2.0,
        max_len=3,
    )
    loss.backward()
    return loss.detach(), stats, logp.grad


def test_the_sequence_ratio_is_the_geometric_mean_of_the_token_ratios() -> None:
    loss, stats, grad = run(GSPO, torch.tensor([1.0, 1.0], dtype=F64))
    s0 = math.exp(0.05)
    # row 0 inside: -s0 per token; row 1 clipped: -1.28 per token; token mean over 4 tokens
    assert math.isclose(float(loss), (-2 * s0 - 2 * 1.28) / 4, rel_tol=1e-12)
    assert float(stats.clipped) == 2.0  # both tokens of row 1
    # d loss / d logp_t = -A * s / total_tokens on row 0's tokens (each its own log-prob's
    # gradient scaled by the sequence ratio); 0 on the clipped row and on padding
    expected = torch.tensor([[-s0 / 4, -s0 / 4, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    assert torch.allclose(grad, expected, rtol=1e-12, atol=0)


def test_the_token_ratio_differs_on_the_same_inputs() -> None:
    loss, stats, _ = run(TOKEN, torch.tensor([1.0, 1.0], dtype=F64))
    # row 0: -(e^0.2 + e^-0.1); row 1: e^0.5 = 1.65 and e^0.4 = 1.49 both clipped to 1.28
    expected = (-(math.exp(0.2) + math.exp(-0.1)) - 2 * 1.28) / 4
    assert math.isclose(float(loss), expected, rel_tol=1e-12)
    assert float(stats.clipped) == 2.0


def test_per_token_advantages_weigh_each_token() -> None:
    advantages = torch.tensor([[1.0, -2.0, math.nan], [0.5, 0.0, math.inf]], dtype=F64)
    loss, _, grad = run(TOKEN, advantages)
    r = [math.exp(0.2), math.exp(-0.1), math.exp(0.5)]
    # (0,0) r=1.22 A=1 inside: -1.2214; (0,1) r=0.905 A=-2 inside: +1.8097;
    # (1,0) r=1.65 A=0.5 clipped: -0.5 * 1.28; (1,1) A=0: 0; padding's NaN and inf unread
    expected = (-r[0] + 2 * r[1] - 0.5 * 1.28) / 4
    assert math.isclose(float(loss), expected, rel_tol=1e-12)
    want = torch.tensor([[-r[0] / 4, 2 * r[1] / 4, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    assert torch.allclose(grad, want, rtol=1e-12, atol=0)


def test_an_unknown_ratio_is_named() -> None:
    with pytest.raises(ValueError, match="ratio must be one of \\('token', 'sequence'\\), got 'x'"):
        LossConfig(ratio="x")  # type: ignore[arg-type]


def test_advantages_of_another_shape_are_refused() -> None:
    with pytest.raises(ValueError, match="advantages must have shape"):
        run(TOKEN, torch.zeros(2, 2, dtype=F64))
