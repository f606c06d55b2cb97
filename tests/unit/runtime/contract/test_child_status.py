"""How a supervised child says how far its start got, and how the supervisor counts
failures to start from that (runtime/contract/child_status.py, _start_failures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.runtime.contract.child_status import (
    STATUS_ENV,
    ChildStatus,
    note_failure,
    note_starting,
    note_up,
    note_working,
    read_status,
)
from asyncrl.runtime.launch._start_failures import StartFailures

STARTING = ChildStatus(starting=True)
UP = ChildStatus(starting=True, up=True)
WORKED_THEN_FAILED = ChildStatus(starting=True, up=True, working=True, reason="a")
FAILED_AT_FIRST_WORK = ChildStatus(starting=True, up=True, reason="a")
SILENT = ChildStatus()


def test_the_supervisor_reads_what_the_child_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "generate-0.status"
    monkeypatch.setenv(STATUS_ENV, str(path))
    assert read_status(path) == SILENT  # nothing written yet
    note_starting()
    note_failure("first\nsecond   line")
    assert read_status(path) == ChildStatus(starting=True, reason="first second line")
    note_up()
    note_failure("x" * 10_000)
    status = read_status(path)
    assert status.up and status.reason is not None and status.failed_at_first_work
    assert len(status.reason) == 400 and status.reason.endswith("...")
    note_working()
    assert read_status(path).working and not read_status(path).failed_at_first_work


def test_without_a_supervisor_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(STATUS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    note_starting()
    note_up()
    note_failure("no one listens")
    assert list(tmp_path.iterdir()) == []


def test_failures_to_start_count_while_the_reason_repeats() -> None:
    failures = StartFailures(limit=3, healthy_after_s=30.0)
    assert [failures.record(STARTING, 1.0, "a") for _ in range(3)] == [False, False, True]
    assert failures.count == 3 and failures.reason == "a"


@pytest.mark.parametrize(
    ("status", "lived_s", "reason"),
    [
        (UP, 1.0, "a"),  # it came up, then crashed or was killed without a word
        (WORKED_THEN_FAILED, 1.0, "a"),  # it came up and worked, then failed
        (SILENT, 30.0, "a"),  # it says nothing, but it ran a while
        (STARTING, 1.0, "b"),  # another reason
    ],
)
def test_anything_else_starts_the_count_over(
    status: ChildStatus, lived_s: float, reason: str
) -> None:
    failures = StartFailures(limit=3, healthy_after_s=30.0)
    failures.record(STARTING, 1.0, "a")
    failures.record(STARTING, 1.0, "a")
    failures.record(status, lived_s, reason)
    assert not failures.record(STARTING, 1.0, "a")


def test_a_child_that_came_up_and_failed_in_its_own_words_before_any_work_counts() -> None:
    # A training group whose first update breaks: up on every start, and failing there.
    failures = StartFailures(limit=3, healthy_after_s=30.0)
    assert not failures.record(STARTING, 1.0, "a")
    assert not failures.record(FAILED_AT_FIRST_WORK, 600.0, "a")
    assert failures.record(FAILED_AT_FIRST_WORK, 1.0, "a")


def test_a_start_that_never_came_up_counts_however_long_it_took() -> None:
    failures = StartFailures(limit=2, healthy_after_s=30.0)
    assert not failures.record(STARTING, 600.0, "a")
    assert failures.record(STARTING, 600.0, "a")


def test_a_silent_child_that_failed_soon_counts_and_limit_0_never_gives_up() -> None:
    assert StartFailures(limit=1, healthy_after_s=30.0).record(SILENT, 1.0, "exit code 1")
    never = StartFailures(limit=0, healthy_after_s=30.0)
    assert not any(never.record(STARTING, 1.0, "a") for _ in range(10))
