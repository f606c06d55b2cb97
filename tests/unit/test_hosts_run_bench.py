"""The figures tests/bench/hosts_run.py takes from a run's own records."""

from __future__ import annotations

import math

from tests.bench.hosts_run import delivery_times, per_step, quantile, relays, steps_per_second
from tests.support.hosts import Traffic


def test_delivery_times_come_from_the_step_lines_in_step_order() -> None:
    metrics = [
        {"step": 1, "elapsed_s": 10.0},
        {"step": 2, "elapsed_s": 11.0, "versions_loaded": [
            {"step": 1, "trained_to_published_s": 0.01, "published_to_loaded_s": 0.5}]},
        {"step": 3, "elapsed_s": 12.0},
        # Two versions reached every generator at once (the first was skipped); one was
        # published before the scheduler restarted, so it has no publication time.
        {"step": 4, "elapsed_s": 13.0, "versions_loaded": [
            {"step": 3, "published_to_loaded_s": 0.25},
            {"step": 2, "trained_to_loaded_s": 2.0}]},
    ]  # fmt: skip
    assert delivery_times(metrics) == [0.5, 0.25]
    assert delivery_times([{"step": 1, "elapsed_s": 1.0}]) == []


def test_quantiles_interpolate_and_say_nan_for_nothing() -> None:
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([0.0, 10.0], 0.9) == 9.0
    assert quantile([4.0], 0.9) == 4.0
    assert math.isnan(quantile([], 0.5))


def test_steps_per_second_leave_the_start_up_out() -> None:
    metrics = [{"step": s, "elapsed_s": 30.0 + 0.5 * s} for s in range(1, 11)]
    assert steps_per_second(metrics) == 2.0
    assert math.isnan(steps_per_second(metrics[:1]))


def test_relays_count_each_generators_sources_and_nothing_else() -> None:
    loads = [
        {"worker": "generate-h2-0", "source": "train-0", "version": 1},
        {"worker": "generate-h4-1", "source": "generate-h2-0", "version": 1},
        {"worker": "generate-h4-1", "source": "generate-h2-0", "version": 2},
        {"worker": "logp-0", "source": "train-0", "version": 1},
    ]
    assert relays(loads) == {
        "train-0 -> generate-h2-0": 1,
        "generate-h2-0 -> generate-h4-1": 2,
    }


def test_traffic_per_step_is_the_counters_difference_over_the_steps() -> None:
    assert per_step(Traffic(100, 50), Traffic(1100, 2050), 10) == Traffic(100, 200)
