"""Dynamic sampling (DAPO): whether a group's rewards carry a learning signal.

Group-relative advantages are the rewards less the group's baseline: a group whose
responses all scored the same has zero advantage everywhere, so it costs a batch slot and
teaches nothing. :func:`filter_reason` judges one group by ``algorithm.filter_groups``:

- the metric is the task's own reward (``metric: task``; ``RewardsOut.parts["task"]``
  where the reward has parts, else the rewards) or the reward trained on (``reward``);
- the group carries signal iff the metric's standard deviation over its responses
  (population, as the advantages use) is above ``min_std``; responses that all scored
  exactly alike have no spread whatever rounding a mean would add;
- and, when bounds are set, iff the metric's mean lies within ``[mean_low, mean_high]``.

The reward role calls it on each group it scores; a group it names a reason for leaves
the pipeline as ``filtered`` (the scheduler's core, transitions.py) and is never trained.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from asyncrl.runtime.contract.config.recipes import FilterGroupsSection

if TYPE_CHECKING:
    from ..payloads import RewardsOut

__all__ = ["filter_reason", "metric_values"]


def metric_values(rewards: RewardsOut, metric: str) -> np.ndarray:
    """The per-response values ``metric`` judges a group by, from a ``RewardsOut``."""
    if metric == "reward":
        return np.asarray(rewards.rewards, np.float64)
    return np.asarray(rewards.parts.get("task", rewards.rewards), np.float64)


def filter_reason(rewards: RewardsOut, rule: FilterGroupsSection) -> str | None:
    """None if the group (its ``RewardsOut``) carries signal; else why not, in one line."""
    values = metric_values(rewards, rule.metric)
    n, what = len(values), f"{rule.metric} reward"
    if n == 0:
        return f"{what}: no responses"
    spread = 0.0 if np.ptp(values) == 0 else float(np.std(values))
    if spread <= rule.min_std:
        if spread == 0:
            return f"{what} {_num(values[0])} for all {n} responses"
        return f"{what} std {_num(spread)} <= min_std {_num(rule.min_std)} over {n} responses"
    mean = float(np.mean(values))
    if rule.mean_low is not None and mean < rule.mean_low:
        return f"{what} mean {_num(mean)} below mean_low {_num(rule.mean_low)}"
    if rule.mean_high is not None and mean > rule.mean_high:
        return f"{what} mean {_num(mean)} above mean_high {_num(rule.mean_high)}"
    return None


def _num(value: float) -> str:
    return f"{float(value):.4g}"
