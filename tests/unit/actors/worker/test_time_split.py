"""A worker's wall time split into disjoint buckets, on a fake clock."""

from __future__ import annotations

import threading

from asyncrl.actors.worker.time_split import TimeSplit
from asyncrl.runtime.contract.bus import TimeBucket as B


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.now += seconds


def by_name(seconds: list[float]) -> dict[str, float]:
    return {b.key: round(seconds[b], 9) for b in B if seconds[b]}


def test_nested_spans_charge_the_innermost_and_everything_adds_up() -> None:
    clock = FakeClock()
    split = TimeSplit(clock)
    split.start()
    clock.wait(1)  # outside any span: the loop's own bookkeeping
    with split.spent_on(B.WEIGHTS):
        clock.wait(2)
        with split.spent_on(B.SCHEDULER):  # asking whom to fetch from, while loading
            clock.wait(0.5)
        clock.wait(3)
    with split.spent_on(B.COMPUTE):
        clock.wait(4)
    taken = split.take()
    assert by_name(taken) == {"other": 1, "weights": 5, "scheduler": 0.5, "compute": 4}
    assert sum(taken) == 10.5  # all of the wall time since start
    clock.wait(2)
    assert by_name(split.take()) == {"other": 2}  # since the previous take, and only that


def test_a_span_can_be_charged_elsewhere_once_its_end_is_known() -> None:
    clock = FakeClock()
    split = TimeSplit(clock)
    split.start()
    with split.spent_on(B.SCHEDULER) as span:  # a claim...
        clock.wait(0.25)
        span.charge_to(B.WAITING_FOR_WORK)  # ...that found nothing
    assert by_name(split.take()) == {"waiting_for_work": 0.25}


def test_a_take_inside_a_span_counts_what_it_spent_so_far() -> None:
    clock = FakeClock()
    split = TimeSplit(clock)
    split.start()
    with split.spent_on(B.COMPUTE):
        clock.wait(1)
        assert by_name(split.take()) == {"compute": 1}
        clock.wait(2)
    assert by_name(split.take()) == {"compute": 2}


def test_only_the_started_thread_is_measured() -> None:
    clock = FakeClock()
    split = TimeSplit(clock)
    with split.spent_on(B.COMPUTE):  # before start: nothing
        clock.wait(5)
    split.start()

    def elsewhere() -> None:  # e.g. the link's late-reply thread sending a Fail
        with split.spent_on(B.SCHEDULER):
            clock.wait(1)
        assert sum(split.take()) == 0

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert by_name(split.take()) == {"other": 1}  # the main loop's time, as it passed
