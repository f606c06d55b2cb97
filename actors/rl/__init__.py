"""The RL objectives as pure torch functions: advantage estimators, returns and losses."""

from .advantages import ESTIMATORS, GROUP_ESTIMATORS, group_advantages
from .correction import (
    CorrectionStats,
    correct,
    correction_metrics,
    merge_correction_stats,
)
from .estimate import Estimate, estimate_advantages
from .loss import RATIOS, LossConfig, LossStats, loss_metrics, merge_stats, policy_loss
from .returns import discounted_returns, gae, last_token_rewards, masked_whiten
from .value_loss import value_loss

__all__ = [
    "ESTIMATORS",
    "GROUP_ESTIMATORS",
    "RATIOS",
    "CorrectionStats",
    "Estimate",
    "LossConfig",
    "LossStats",
    "correct",
    "correction_metrics",
    "discounted_returns",
    "estimate_advantages",
    "gae",
    "group_advantages",
    "last_token_rewards",
    "loss_metrics",
    "masked_whiten",
    "merge_correction_stats",
    "merge_stats",
    "policy_loss",
    "value_loss",
]
