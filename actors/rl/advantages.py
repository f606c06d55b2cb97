"""Group-relative advantages: each response is scored against its siblings.

These estimators need no value network: the ``n`` responses sampled for one prompt form a
group, and a response's advantage is how much better its reward was than a baseline made of
the group's. GRPO's baseline is the group mean (scaled by the group's spread), Dr. GRPO's
the mean alone, RLOO's the mean of the *other* responses.
"""

from __future__ import annotations

from typing import get_args

import torch

from asyncrl.runtime.contract.config.learning import Estimator

__all__ = [
    "ESTIMATORS",
    "GROUP_ESTIMATORS",
    "STD_EPS",
    "Estimator",
    "check_estimator",
    "group_advantages",
]

# Every advantage estimator of the runtime (declared with the config): the group ones
# below, the token-level ones (REINFORCE++ and its group baseline, GAE) in returns.py.
ESTIMATORS: tuple[str, ...] = get_args(Estimator)
# The estimators whose advantage is one number per response, computed from rewards alone.
GROUP_ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo")

# Keeps the division finite for a group whose rewards are all equal (std 0); its centred
# rewards are then exactly 0, so its advantages are exactly 0 whatever the epsilon.
STD_EPS = 1e-6


def check_estimator(estimator: str, allowed: tuple[str, ...] = ESTIMATORS) -> None:
    """Raise a ValueError naming ``estimator`` when it is not one of ``allowed``."""
    if estimator not in allowed:
        raise ValueError(f"estimator must be one of {allowed}, got {estimator!r}")


def group_advantages(rewards: torch.Tensor, estimator: str) -> torch.Tensor:
    """Advantages of ``rewards`` shaped ``[groups, n]``, one row per prompt, same shape back.

    ``"grpo"``: ``(r - mean) / (std + 1e-6)`` within each row. Dividing by the spread gives
    every prompt's group the same scale, whatever its reward range.

    ``"dr_grpo"`` ("Understanding R1-Zero-Like Training", Dr. GRPO): ``r - mean`` only. The
    std division up-weights prompts that are nearly always or nearly never solved (tiny
    spread), a difficulty bias that Dr. GRPO removes; the loss side of Dr. GRPO (a constant
    normaliser) lives in :func:`asyncrl.actors.rl.loss.policy_loss`.

    ``"rloo"`` (REINFORCE leave-one-out): ``r_i - mean_{j != i} r_j``, which is
    ``n / (n - 1) * (r_i - mean)``. The baseline leaves out the response it scores, so it
    does not depend on that response's own reward and the estimate is unbiased. Needs
    ``n >= 2``.

    A group whose rewards are all equal carries no learning signal and gets zeros under
    each. Integer rewards are promoted to float32; float inputs keep their dtype.
    """
    check_estimator(estimator, GROUP_ESTIMATORS)
    rewards = checked_rewards(rewards)
    n = rewards.shape[1]
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if estimator == "dr_grpo":
        return centred
    if estimator == "rloo":
        if n < 2:
            raise ValueError(f"rloo needs at least 2 responses per group, got n={n}")
        return centred * (n / (n - 1))
    # Population std (correction=0, i.e. unbiased=False): the group is the whole set being
    # standardised, not a sample from which to estimate a wider spread. It is defined for
    # n == 1 (Bessel's n - 1 would divide by zero and give NaN), and Bessel's factor would
    # only rescale every advantage by the same sqrt((n - 1) / n), which the learning rate
    # absorbs anyway.
    std = rewards.std(dim=1, keepdim=True, correction=0)
    return centred / (std + STD_EPS)


def checked_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """``rewards`` as a floating ``[groups, n]`` tensor; ValueError if it is not one or
    holds a non-finite value."""
    if not isinstance(rewards, torch.Tensor) or rewards.ndim != 2 or rewards.shape[1] == 0:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards)
        raise ValueError(f"rewards must be a [groups, n] tensor with n >= 1, got {shape}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if not bool(torch.isfinite(rewards).all()):
        # One NaN reward would turn its whole group's advantages, and so the step, into NaN.
        raise ValueError("rewards must all be finite")
    return rewards
