"""Dynamic sampling's decision on hand-made groups: which carry signal, and why not."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from asyncrl.actors.payloads import RewardsOut
from asyncrl.actors.rl.filtering import filter_reason
from asyncrl.runtime.contract.config.recipes import FilterGroupsSection

ON = FilterGroupsSection(enabled=True)


def out(*values: float) -> RewardsOut:
    return RewardsOut(np.asarray(values, np.float32))


@dataclass
class WithParts:  # a reward with parts (the task's own, and shaping on top)
    rewards: np.ndarray
    parts: dict[str, np.ndarray] = field(default_factory=dict)


def test_a_group_whose_responses_all_scored_alike_is_filtered_with_the_value():
    assert filter_reason(out(*[1.0] * 8), ON) == "task reward 1 for all 8 responses"
    assert filter_reason(out(0.0, 0.0, 0.0, 0.0), ON) == "task reward 0 for all 4 responses"


def test_equal_rewards_that_a_mean_would_round_are_still_no_spread():
    # 0.1 in float32 eight times: a float mean of them need not be exactly 0.1
    assert filter_reason(out(*[0.1] * 8), ON) == "task reward 0.1 for all 8 responses"


def test_one_differing_response_is_signal():
    assert filter_reason(out(1.0, 1.0, 1.0, 0.0), ON) is None


def test_min_std_is_a_strict_bound():
    rule = FilterGroupsSection(enabled=True, min_std=0.5)
    # [0, 1, 0, 1]: mean 0.5, population std exactly 0.5
    assert filter_reason(out(0.0, 1.0, 0.0, 1.0), rule) == (
        "task reward std 0.5 <= min_std 0.5 over 4 responses"
    )
    # [0, 2]: std 1.0
    assert filter_reason(out(0.0, 2.0), rule) is None


def test_mean_bounds_filter_groups_outside_them():
    rule = FilterGroupsSection(enabled=True, mean_low=0.2, mean_high=0.7)
    # mean 0.75 (std > 0)
    assert (
        filter_reason(out(1.0, 1.0, 1.0, 0.0), rule) == "task reward mean 0.75 above mean_high 0.7"
    )
    # mean 0.125
    assert filter_reason(out(1.0, 0, 0, 0, 0, 0, 0, 0), rule) == (
        "task reward mean 0.125 below mean_low 0.2"
    )
    assert filter_reason(out(1.0, 0.0), rule) is None  # mean 0.5


def test_the_task_metric_reads_the_task_part_and_the_reward_metric_the_sum():
    # the task paid 1 to every response; an overlong penalty made the sums differ
    rewards = WithParts(
        np.asarray([1.0, 0.5, 1.0], np.float32),
        {"task": np.ones(3, np.float32), "overlong": np.asarray([0, -0.5, 0], np.float32)},
    )
    assert filter_reason(rewards, ON) == "task reward 1 for all 3 responses"
    by_reward = FilterGroupsSection(enabled=True, metric="reward")
    assert filter_reason(rewards, by_reward) is None


def test_mean_low_above_mean_high_is_refused():
    with pytest.raises(ValueError, match=r"mean_low: got 0\.9 above mean_high=0\.1"):
        FilterGroupsSection(mean_low=0.9, mean_high=0.1)
