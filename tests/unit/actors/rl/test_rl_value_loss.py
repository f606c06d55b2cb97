"""The critic's clipped value loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.rl import value_loss

F64 = torch.float64

# clip 0.2 around the old values; the last position is padding (NaN value, unread)
VALUES = [0.5, 1.0, 0.9, math.nan]
OLD = [0.4, 0.4, 0.4, 0.0]
RETURNS = [1.0, 0.0, 1.0, 5.0]
MASK = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)


def run(mask: torch.Tensor = MASK, clip: float = 0.2):
    values = torch.tensor([VALUES], dtype=F64, requires_grad=True)
    loss, clipped = value_loss(
        values,
        torch.tensor([OLD], dtype=F64),
        torch.tensor([RETURNS], dtype=F64),
        mask,
        clip=clip,
        total_tokens=float(mask.sum()),
    )
    loss.backward()
    return loss.detach(), clipped, values.grad


def test_the_clipped_value_loss_by_hand() -> None:
    loss, clipped, grad = run()
    # t0: v 0.5 within 0.1 of old: both errors (0.5 - 1)^2 = 0.25          -> 0.125
    # t1: v 1.0, clipped v 0.6, target 0: unclipped 1.0 > clipped 0.36      -> 0.5
    # t2: v 0.9, clipped v 0.6, target 1: clipped 0.16 > unclipped 0.01     -> 0.08 (clipped)
    assert math.isclose(float(loss), (0.125 + 0.5 + 0.08) / 3, rel_tol=1e-12)
    assert int(clipped) == 1
    # d/dv: (v - R) / 3 where the unclipped error won; 0 where the clipped one did
    want = torch.tensor([[-0.5 / 3, 1.0 / 3, 0.0, 0.0]], dtype=F64)
    assert torch.allclose(grad, want, rtol=1e-12, atol=0)


def test_without_clipping_it_is_half_the_mean_squared_error() -> None:
    loss, clipped, _ = run(clip=math.inf)
    assert math.isclose(float(loss), (0.25 + 1.0 + 0.01) / 2 / 3, rel_tol=1e-12)
    assert int(clipped) == 0


def test_a_value_loss_that_ignored_the_mask_would_be_nan() -> None:
    # The padding's NaN value and return 5 count only if the mask is ignored.
    loss, _, _ = run(mask=torch.ones(1, 4, dtype=torch.bool))
    assert math.isnan(float(loss))


@pytest.mark.parametrize("clip", [0.0, -1.0, math.nan])
def test_a_clip_that_is_not_positive_is_named(clip: float) -> None:
    with pytest.raises(ValueError, match="clip must be > 0"):
        run(clip=clip)
