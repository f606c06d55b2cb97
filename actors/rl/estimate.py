"""A step's token advantages under any estimator: the one entry the trainer calls.

The step's rows (sequences) come from its groups; each row belongs to one trajectory,
``(group, owner)``, whose reward is ``rewards[group, owner]``. Every estimator gives an
advantage per model token, ``[rows, T]``, 0 off the mask:

- ``grpo``, ``dr_grpo``, ``rloo``: the trajectory's group advantage on each of its tokens;
- ``reinforce_pp``: discounted returns of the reward paid at the last model token,
  whitened over the step's tokens (REINFORCE++);
- ``reinforce_pp_baseline``: the same from rewards minus their group's mean;
- ``gae``: GAE over the critic's ``values``, whitened over the step's tokens, with the
  critic's targets (the unwhitened returns) beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .advantages import check_estimator, checked_rewards, group_advantages
from .returns import discounted_returns, gae, last_token_rewards, masked_whiten

__all__ = ["Estimate", "estimate_advantages"]


@dataclass(frozen=True)
class Estimate:
    advantages: torch.Tensor  # [rows, T], 0 off the mask
    returns: torch.Tensor | None  # [rows, T] the critic's targets; gae only


def estimate_advantages(
    estimator: str,
    rewards: torch.Tensor,
    group: torch.Tensor,
    owner: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    values: torch.Tensor | None = None,
) -> Estimate:
    """Advantages of the step's rows under ``estimator`` (see the module docstring).

    ``rewards`` is ``[groups, n]``; ``group`` and ``owner`` (long ``[rows]``) say whose
    trajectory each row is; ``mask`` (``[rows, T]``) is true on the model's tokens;
    ``values`` (``[rows, T]``) is the critic's estimate, required by ``gae`` alone.
    """
    check_estimator(estimator)
    rewards = checked_rewards(rewards)
    real = mask.to(torch.bool)
    if group.shape != real.shape[:1] or owner.shape != real.shape[:1]:
        raise ValueError(
            f"group and owner must have shape [rows] = {tuple(real.shape[:1])}, "
            f"got {tuple(group.shape)} and {tuple(owner.shape)}"
        )
    if estimator == "gae":
        if values is None:
            raise ValueError("estimator 'gae' needs the critic's values, got none")
        paid = last_token_rewards(rewards[group, owner], real)
        advantages, returns = gae(paid, values, real, gamma, lam)
        # The critic's targets stay in the rewards' scale: whitening them would make the
        # critic chase a target whose scale moves with every step's batch.
        return Estimate(masked_whiten(advantages, real), returns)
    if estimator in ("reinforce_pp", "reinforce_pp_baseline"):
        if estimator == "reinforce_pp_baseline":
            rewards = group_advantages(rewards, "dr_grpo")  # minus the group's mean
        paid = last_token_rewards(rewards[group, owner], real)
        return Estimate(masked_whiten(discounted_returns(paid, real, gamma), real), None)
    per_row = group_advantages(rewards, estimator)[group, owner]
    return Estimate(torch.where(real, per_row[:, None], 0.0), None)
