"""The scheduler loop's own timings: power-of-two histograms per part, collections too."""

from __future__ import annotations

import gc

from asyncrl.runtime.scheduler.service.loop_timings import Histogram, LoopTimings


def test_quantiles_are_the_upper_bounds_of_their_buckets() -> None:
    histogram = Histogram()
    for _ in range(98):
        histogram.add(300e-6)  # 300 µs: under 512
    histogram.add(0.020)
    histogram.add(0.020)  # 20 ms: under 32,768 µs
    summary = histogram.summary()
    assert summary["count"] == 100
    assert summary["p50_us"] == 512
    assert summary["p99_us"] == 32_768  # the slow 2%, not hidden by the fast 98%
    assert summary["max_us"] == 20_000


def test_an_empty_histogram_says_nothing_took_time() -> None:
    assert Histogram().summary() == {
        "count": 0, "total_ms": 0.0, "p50_us": 0, "p99_us": 0, "max_us": 0,
    }  # fmt: skip


def test_collections_are_timed_by_generation_while_watched() -> None:
    timings = LoopTimings()
    timings.watch_collections()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        timings.stop_watching()
    summary = timings.summary()
    assert summary["gc.gen0"]["count"] >= 1 and summary["gc.gen2"]["count"] >= 1
    gc.collect(2)  # not watched any more
    assert timings.summary()["gc.gen2"]["count"] == summary["gc.gen2"]["count"]
