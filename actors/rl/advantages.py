"""Group-relative advantages: each response is scored against its siblings.

GRPO needs no value network: the ``n`` responses sampled for one prompt form a group, and a
response's advantage is how much better its reward was than the group's. The baseline is the
group mean; the estimators differ in whether they also divide by the group's spread.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

__all__ = ["ESTIMATORS", "STD_EPS", "Estimator", "group_advantages"]

Estimator = Literal["grpo", "dr_grpo"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)

# Keeps the division finite for a group whose rewards are all equal (std 0); its centred
# rewards are then exactly 0, so its advantages are exactly 0 whatever the epsilon.
STD_EPS = 1e-6


def check_estimator(estimator: str) -> None:
    """Raise a ValueError naming ``estimator`` when it is not one of :data:`ESTIMATORS`."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")


def group_advantages(rewards: torch.Tensor, estimator: str) -> torch.Tensor:
    """Advantages of ``rewards`` shaped ``[groups, n]``, one row per prompt, same shape back.

    ``"grpo"``: ``(r - mean) / (std + 1e-6)`` within each row. Dividing by the spread gives
    every prompt's group the same scale, whatever its reward range.

    ``"dr_grpo"`` ("Understanding R1-Zero-Like Training", Dr. GRPO): ``r - mean`` only. The
    std division up-weights prompts that are nearly always or nearly never solved (tiny
    spread), a difficulty bias that Dr. GRPO removes; the loss side of Dr. GRPO (a constant
    normaliser) lives in :func:`asyncrl.actors.rl.loss.policy_loss`.

    A group whose rewards are all equal carries no learning signal and gets zeros under
    both. Integer rewards are promoted to float32; float inputs keep their dtype.
    """
    check_estimator(estimator)
    if not isinstance(rewards, torch.Tensor) or rewards.ndim != 2 or rewards.shape[1] == 0:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards)
        raise ValueError(f"rewards must be a [groups, n] tensor with n >= 1, got {shape}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    if not bool(torch.isfinite(rewards).all()):
        # One NaN reward would turn its whole group's advantages, and so the step, into NaN.
        raise ValueError("rewards must all be finite")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if estimator == "dr_grpo":
        return centred
    # Population std (correction=0, i.e. unbiased=False): the group is the whole set being
    # standardised, not a sample from which to estimate a wider spread. It is defined for
    # n == 1 (Bessel's n - 1 would divide by zero and give NaN), and Bessel's factor would
    # only rescale every advantage by the same sqrt((n - 1) / n), which the learning rate
    # absorbs anyway.
    std = rewards.std(dim=1, keepdim=True, correction=0)
    return centred / (std + STD_EPS)
