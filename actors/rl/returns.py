"""Token-level returns and advantages over masked, possibly multi-turn trajectories.

A row is one sequence's response positions ``[T]``; ``mask`` is true on the tokens the
model sampled. Observation and tool tokens between turns (mask false) are not actions of
the policy: they carry no reward, value, return or advantage. The recursions below skip
them, so the step after a model token is the next *model* token, however many observation
tokens lie between; padding after a row's end is skipped the same way.

All functions are pure: tensors in, tensors out; values at masked-out positions are never
read (they may be anything, NaN included) and come back as exactly 0.
"""

from __future__ import annotations

import torch

from .advantages import STD_EPS

__all__ = ["discounted_returns", "gae", "last_token_rewards", "masked_whiten"]


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` token rewards: each row's reward ``rewards[b]`` on its last model token.

    A trajectory is paid once, at its end; the outcome-reward estimators (REINFORCE++,
    GAE) spread it back over the tokens through their recursions.
    """
    real = _checked_mask(mask)
    if rewards.shape != real.shape[:1]:
        raise ValueError(
            f"rewards must have shape [B] = {tuple(real.shape[:1])}, got {tuple(rewards.shape)}"
        )
    positions = torch.arange(real.shape[1], device=real.device).expand_as(real)
    last = torch.where(real, positions, -1).amax(dim=1)
    out = torch.zeros(real.shape, dtype=_float(rewards), device=real.device)
    rows = torch.nonzero(last >= 0).squeeze(1)
    out[rows, last[rows]] = rewards[rows].to(out.dtype)
    return out


def discounted_returns(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float
) -> torch.Tensor:
    """``G_t = r_t + gamma * G_t'`` with ``t'`` the next model token of the row (REINFORCE++).

    ``[B, T]`` in, ``[B, T]`` out, 0 off the mask.
    """
    real = _checked_mask(mask, token_rewards)
    _check_unit("gamma", gamma)
    rewards = _masked(token_rewards.to(_float(token_rewards)), real)
    out = torch.zeros_like(rewards)
    following = torch.zeros_like(rewards[:, 0])  # the return at the next model token
    for t in reversed(range(rewards.shape[1])):
        here = rewards[:, t] + gamma * following
        out[:, t] = torch.where(real[:, t], here, 0.0)
        following = torch.where(real[:, t], here, following)
    return out


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over model tokens: ``(advantages, returns)``.

    With ``t'`` the next model token of the row (none after the last: its value is 0, the
    trajectory has ended)::

        delta_t = r_t + gamma * V_t' - V_t
        A_t     = delta_t + gamma * lam * A_t'
        R_t     = A_t + V_t            (the critic's target)

    ``lam = 1`` gives the Monte Carlo return minus the value, ``lam = 0`` the one-step
    temporal difference. Every tensor is ``[B, T]``; both results are 0 off the mask.
    """
    real = _checked_mask(mask, token_rewards)
    _checked_mask(mask, values)
    _check_unit("gamma", gamma)
    _check_unit("lam", lam)
    dtype = torch.promote_types(_float(token_rewards), _float(values))
    rewards = _masked(token_rewards.to(dtype), real)
    v = _masked(values.to(dtype), real)
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - v[:, t]
        here = delta + gamma * lam * next_advantage
        on = real[:, t]
        advantages[:, t] = torch.where(on, here, 0.0)
        next_advantage = torch.where(on, here, next_advantage)
        next_value = torch.where(on, v[:, t], next_value)
    returns = _masked(advantages + v, real)
    return advantages, returns


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / (std + 1e-6)`` over the masked tokens of the whole batch, 0 elsewhere.

    PPO and REINFORCE++ whiten per step: the update's scale then does not drift with the
    rewards' scale or the critic's error. Population std, as for GRPO's groups; a batch
    whose masked values are all equal gets exact zeros.
    """
    real = _checked_mask(mask, values)
    x = _masked(values.to(_float(values)), real)
    count = real.sum()
    if int(count) == 0:
        return x
    mean = x.sum() / count
    centred = _masked(x - mean, real)
    std = (centred.square().sum() / count).sqrt()
    return centred / (std + STD_EPS)


def _masked(values: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``values`` with 0 off the mask (a select, not a product: 0 * NaN is NaN)."""
    return torch.where(real, values, 0.0)


def _float(t: torch.Tensor) -> torch.dtype:
    return t.dtype if t.is_floating_point() else torch.float32


def _checked_mask(mask: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """``mask`` as bool ``[B, T]``; ValueError when it is not 2-d or ``like`` differs in shape."""
    if not isinstance(mask, torch.Tensor) or mask.ndim != 2:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"mask must be a [B, T] tensor, got {shape}")
    if like is not None and tuple(like.shape) != tuple(mask.shape):
        raise ValueError(f"expected the mask's shape {tuple(mask.shape)}, got {tuple(like.shape)}")
    return mask.to(torch.bool)


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
