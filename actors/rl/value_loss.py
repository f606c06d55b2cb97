"""The critic's loss: PPO's clipped value loss over the model's tokens.

The critic regresses each model token's value on its return. Clipping keeps one update
from moving a value further than ``clip`` from the value the critic predicted when the
advantages were estimated (the *old* value), the critic's own trust region: the loss is
the larger of the unclipped and the clipped squared errors, so a value that left the
region in the direction of its target gets no gradient from the clipped side.
"""

from __future__ import annotations

import torch

__all__ = ["value_loss"]


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    total_tokens: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, clipped tokens)`` of one micro-batch, every tensor ``[B, T]``.

    Per model token, with ``v_c = old + clamp(v - old, -clip, clip)``::

        loss_t = 0.5 * max((v - R)^2, (v_c - R)^2)

    summed and divided by ``total_tokens``, the step's model tokens, so that the losses of
    a step's micro-batches add up to the step's. ``clip = inf`` turns clipping off. Only
    ``values`` gets a gradient; positions off the mask may hold anything.
    """
    if not clip > 0:
        raise ValueError(f"clip must be > 0, got {clip!r}")
    if not total_tokens > 0:
        raise ValueError(f"total_tokens must be > 0, got {total_tokens!r}")
    for name, tensor in (("old_values", old_values), ("returns", returns), ("mask", mask)):
        if tensor.shape != values.shape:
            raise ValueError(
                f"{name} must have values' shape {tuple(values.shape)}, got {tuple(tensor.shape)}"
            )
    real = mask.to(torch.bool)
    v = torch.where(real, values, 0.0)
    old = torch.where(real, old_values.detach().to(v.dtype), 0.0)
    target = torch.where(real, returns.detach().to(v.dtype), 0.0)
    clipped_v = old + (v - old).clamp(-clip, clip)
    unclipped_error = (v - target).square()
    clipped_error = (clipped_v - target).square()
    took_clipped = (clipped_error > unclipped_error) & real
    per_token = 0.5 * torch.maximum(unclipped_error, clipped_error)
    loss = torch.where(real, per_token, 0.0).sum() / total_tokens
    return loss, took_clipped.sum()
