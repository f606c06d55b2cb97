"""Dual clip and the entropy bonus of the policy loss against hand-computed values.

clip range [0.8, 1.28], dual clip c = 3, every importance weight 1 unless said. For
``A < 0`` the token's loss is ``min(max(-A r, -A clip(r)), -A c)``.
"""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.policy.model import entropy_of
from asyncrl.actors.rl import LossConfig, loss_metrics, policy_loss

F64 = torch.float64
DUAL = LossConfig(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)

RATIOS = [[0.5, 2.0, 4.0], [10.0, 10.0, 4.0]]
ADVANTAGES = [[-1.0, -1.0, -1.0], [-1.0, 1.0, -2.0]]
# Per token, by hand:
#   r 0.5, A -1: max(0.5, 0.8) = 0.8 (PPO's clip)       r 10, A -1: max(10, 1.28) = 10 -> 3
#   r 2,   A -1: max(2, 1.28) = 2 (under c)             r 10, A +1: -min(10, 1.28) = -1.28
#   r 4,   A -1: max(4, 1.28) = 4 -> bounded at 3       r 4,  A -2: max(8, 2.56) = 8 -> 6
DUAL_LOSSES = [[0.8, 2.0, 3.0], [3.0, -1.28, 6.0]]
PLAIN_LOSSES = [[0.8, 2.0, 4.0], [10.0, -1.28, 8.0]]


def _loss(cfg: LossConfig, logp: torch.Tensor, *, behaviour=None, entropy=None, mask=None):
    proximal = torch.zeros(2, 3, dtype=F64)
    mask = torch.ones(2, 3) if mask is None else mask
    return policy_loss(
        logp,
        proximal,
        proximal if behaviour is None else behaviour,
        torch.tensor(ADVANTAGES, dtype=F64),
        mask,
        cfg,
        entropy=entropy,
        total_tokens=float(mask.sum()),
        total_sequences=2.0,
        max_len=8,
    )


def _logp() -> torch.Tensor:
    return torch.tensor(RATIOS, dtype=F64).log().requires_grad_(True)


def test_dual_clip_bounds_negative_advantages_loss_at_minus_a_times_c() -> None:
    logp = _logp()
    loss, stats = _loss(DUAL, logp)
    assert loss.item() == pytest.approx(sum(map(sum, DUAL_LOSSES)) / 6, rel=1e-12)
    assert loss_metrics(stats)["dual_clip_frac"] == pytest.approx(3 / 6)
    loss.backward()
    # d loss / d logp = -A r / 6 where the ratio is not clipped, 0 where a clip bound wins
    # (PPO's on the first and fifth token, the dual clip's on the third, fourth and sixth).
    expected = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64) / 6
    assert torch.allclose(logp.grad, expected, atol=1e-12)


def test_without_dual_clip_the_same_tokens_pay_in_full() -> None:
    off = LossConfig(clip_low=0.2, clip_high=0.28)
    loss, stats = _loss(off, _logp())
    assert loss.item() == pytest.approx(sum(map(sum, PLAIN_LOSSES)) / 6, rel=1e-12)
    assert loss_metrics(stats)["dual_clip_frac"] == 0.0


def test_the_importance_weight_multiplies_the_bounded_loss() -> None:
    behaviour = torch.zeros(2, 3, dtype=F64)
    behaviour[0, 2] = -math.log(2.0)  # proximal / behaviour = 2 on the bounded token
    loss, _ = _loss(DUAL, _logp(), behaviour=behaviour)
    losses = [[0.8, 2.0, 2 * 3.0], [3.0, -1.28, 6.0]]
    assert loss.item() == pytest.approx(sum(map(sum, losses)) / 6, rel=1e-12)


def test_padding_is_not_counted_as_dual_clipped() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, stats = _loss(DUAL, _logp(), mask=mask)
    assert loss.item() == pytest.approx((0.8 + 2.0 + 3.0 - 1.28 + 6.0) / 5, rel=1e-12)
    assert loss_metrics(stats)["dual_clip_frac"] == pytest.approx(2 / 5)


@pytest.mark.parametrize("c", [0.5, 1.0, -2.0, math.inf])
def test_a_dual_clip_of_one_or_less_is_refused(c: float) -> None:
    with pytest.raises(ValueError, match="clip_ratio_c"):
        LossConfig(clip_ratio_c=c)


# --- the entropy bonus ---------------------------------------------------------------------

ENTROPY = [[0.5, 1.0, 2.0], [0.25, 0.0, 3.0]]


def test_the_entropy_is_measured_per_trained_token_without_changing_the_loss() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    entropy = torch.tensor(ENTROPY, dtype=F64).requires_grad_(True)
    plain, _ = _loss(DUAL, _logp(), mask=mask)
    loss, stats = _loss(DUAL, _logp(), mask=mask, entropy=entropy)
    assert loss.item() == plain.item()
    loss.backward()
    assert entropy.grad is None  # measured, not trained: no gradient reaches it
    assert loss_metrics(stats)["entropy"] == pytest.approx((0.5 + 1.0 + 2.0 + 0.25 + 0.0) / 5)


@pytest.mark.parametrize("agg", ["token", "sequence"])
def test_the_entropy_bonus_lowers_the_loss_and_its_gradient_raises_the_entropy(agg: str) -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    cfg = LossConfig(clip_ratio_c=3.0, entropy_coef=0.1, loss_agg=agg)
    entropy = torch.tensor(ENTROPY, dtype=F64).requires_grad_(True)
    plain, _ = _loss(LossConfig(clip_ratio_c=3.0, loss_agg=agg), _logp(), mask=mask)
    loss, _ = _loss(cfg, _logp(), mask=mask, entropy=entropy)
    if agg == "token":  # every token weighs 1 / 5
        bonus = 0.1 * (0.5 + 1.0 + 2.0 + 0.25 + 0.0) / 5
        weights = [[1 / 5] * 3, [1 / 5, 1 / 5, 0.0]]
    else:  # each sequence weighs 1 / 2, shared by its tokens
        bonus = 0.1 * ((0.5 + 1.0 + 2.0) / 3 + (0.25 + 0.0) / 2) / 2
        weights = [[1 / 6] * 3, [1 / 4, 1 / 4, 0.0]]
    assert loss.item() == pytest.approx(plain.item() - bonus, rel=1e-12)
    loss.backward()
    # Negative: a descent step on the loss moves every trained token's entropy up.
    expected = -0.1 * torch.tensor(weights, dtype=F64)
    assert torch.allclose(entropy.grad, expected, atol=1e-12)


def test_an_entropy_bonus_without_entropies_is_refused() -> None:
    with pytest.raises(ValueError, match="entropy is required"):
        _loss(LossConfig(entropy_coef=0.1), _logp())
    with pytest.raises(ValueError, match="entropy_coef"):
        LossConfig(entropy_coef=-1.0)


def test_a_descent_step_on_the_bonus_alone_spreads_the_distribution() -> None:
    # Zero advantages: only the bonus moves the logits.
    logits = torch.tensor([[[3.0, 1.0, 0.0, -1.0]]], dtype=F64).requires_grad_(True)

    def entropy() -> torch.Tensor:
        return entropy_of(torch.log_softmax(logits, dim=-1))

    before = entropy().item()
    logp = torch.zeros(1, 1, dtype=F64, requires_grad=True)
    loss, _ = policy_loss(
        logp, logp.detach(), logp.detach(), torch.zeros(1, dtype=F64), torch.ones(1, 1),
        LossConfig(entropy_coef=1.0), entropy=entropy(), total_tokens=1.0,
        total_sequences=1.0, max_len=1,
    )  # fmt: skip
    loss.backward()
    with torch.no_grad():
        logits -= 0.1 * logits.grad
    assert entropy().item() > before
