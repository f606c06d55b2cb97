"""The GRPO objective as pure torch functions: group advantages and the policy loss."""

from .advantages import ESTIMATORS, group_advantages
from .loss import LossConfig, LossStats, loss_metrics, merge_stats, policy_loss

__all__ = [
    "ESTIMATORS",
    "LossConfig",
    "LossStats",
    "group_advantages",
    "loss_metrics",
    "merge_stats",
    "policy_loss",
]
