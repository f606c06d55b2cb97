"""The learning rate of each train step against values worked out by hand (schedule.py's
formula; s = the steps taken before the one whose rate it is)."""

from __future__ import annotations

import math

import pytest

from asyncrl.actors.training.schedule import lr_at
from asyncrl.runtime.contract.config.recipes import ScheduleSection


def _rates(total: int, **schedule) -> list[float]:
    section = ScheduleSection(**schedule)
    return [lr_at(step, 1.0, section, total) for step in range(total + 2)]


def test_constant_is_the_rate_itself_at_every_step() -> None:
    assert lr_at(0, 3e-4, ScheduleSection(), 10) == 3e-4  # exactly: no arithmetic on it
    assert _rates(5) == [1.0] * 7


def test_warmup_climbs_linearly_from_a_fraction_to_the_whole_rate() -> None:
    # 4 steps: 1/4, 2/4, 3/4, 4/4, then the rate (none is wasted at 0)
    assert _rates(6, warmup_steps=4) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert lr_at(0, 2e-3, ScheduleSection(warmup_steps=4), 6) == pytest.approx(5e-4)


def test_linear_decays_from_the_rate_and_the_last_step_still_learns() -> None:
    # 4 steps, no warm-up: 1 - s/4, the floor (0) only past the run
    assert _rates(4, kind="linear") == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]


def test_linear_after_a_warmup_to_a_floor() -> None:
    # W=2: 1/2, 1; then p = (s-2)/(6-2) over s = 2..5, f = 1 - 0.9 p; the floor 0.1 after
    rates = _rates(6, kind="linear", warmup_steps=2, min_lr_ratio=0.1)
    expected = [0.5, 1.0, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1]
    assert rates == pytest.approx(expected, abs=1e-12)


def test_cosine_to_a_floor() -> None:
    # W=0, D=4: f = 0.2 + 0.8 (1 + cos(pi s/4)) / 2 for s = 0..4
    rates = _rates(4, kind="cosine", min_lr_ratio=0.2)
    half = math.sqrt(2) / 2
    expected = [1.0, 0.2 + 0.4 * (1 + half), 0.6, 0.2 + 0.4 * (1 - half), 0.2, 0.2]
    assert rates == pytest.approx(expected, abs=1e-12)
    assert rates[1] == pytest.approx(0.882842712474619, abs=1e-12)


def test_decay_steps_ends_the_decay_before_the_run_does() -> None:
    # D=3 of a 10-step run, W=1: 1 (the warm-up), then cosine over s = 1..3: 1, 1/2, 0
    rates = _rates(10, kind="cosine", warmup_steps=1, decay_steps=3)
    assert rates[:4] == pytest.approx([1.0, 1.0, 0.5, 0.0], abs=1e-12)
    assert rates[4:] == [0.0] * 8


def test_a_run_shorter_than_the_warmup_never_leaves_it() -> None:
    assert _rates(2, kind="linear", warmup_steps=5)[:2] == [0.2, 0.4]


def test_a_negative_step_is_refused() -> None:
    with pytest.raises(ValueError, match="step must be >= 0"):
        lr_at(-1, 1.0, ScheduleSection(), 3)


def test_a_decay_that_ends_within_the_warmup_is_refused() -> None:
    with pytest.raises(ValueError, match="decay_steps: got 3 with warmup_steps=3"):
        ScheduleSection(kind="cosine", warmup_steps=3, decay_steps=3)
