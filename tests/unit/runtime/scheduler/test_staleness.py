"""Staleness admission against hand-computed cases."""

from __future__ import annotations

from asyncrl.runtime.scheduler.core.staleness import (
    admission_capacity,
    step_keeps_promises,
    train_by_step,
)


def test_train_by_is_the_last_step_within_the_bound() -> None:
    assert train_by_step(loaded_version=0, max_staleness=0) == 1  # on-policy: the next step
    assert train_by_step(loaded_version=3, max_staleness=2) == 6


def test_synchronous_admits_one_batch_for_the_next_step() -> None:
    assert admission_capacity({}, steps_done=0, batch=4, train_by=1) == 4
    assert admission_capacity({1: 3}, steps_done=0, batch=4, train_by=1) == 1
    assert admission_capacity({1: 4}, steps_done=0, batch=4, train_by=1) == 0


def test_a_generator_behind_the_trainer_gets_nothing() -> None:
    # loaded version 2, bound 0: train by step 3, but step 3 is already done
    assert admission_capacity({}, steps_done=3, batch=4, train_by=3) == 0


def test_later_train_by_steps_bound_earlier_admissions() -> None:
    # steps 1..3 hold 12 groups; 11 are due by step 3 already, 5 of them by step 2
    due = {2: 5, 3: 6}
    assert admission_capacity(due, steps_done=0, batch=4, train_by=2) == 1  # 8 - 5 = 3, 12 - 11
    assert admission_capacity(due, steps_done=0, batch=4, train_by=3) == 1
    assert admission_capacity(due, steps_done=0, batch=4, train_by=4) == 5  # 16 - 11


def test_a_step_must_not_strand_a_group_due_soon() -> None:
    # batch 1, step 5 next: one group due by 6 (not ready), one due by 7 (ready).
    # Training the ready one now leaves step 6 for the due-by-6 group: fine.
    assert step_keeps_promises({6: 1, 7: 1}, {7: 1}, steps_done=4, batch=1)
    # Two due by 6, only one ready: a step now must take the ready one and the other
    # still fits step 6.
    assert step_keeps_promises({6: 2}, {6: 1}, steps_done=4, batch=1)
    # Two due by 6 and one by 7, only the by-7 one ready: taking it strands one of them.
    assert not step_keeps_promises({6: 2, 7: 1}, {7: 1}, steps_done=4, batch=1)
    # A group due at this very step must be ready.
    assert not step_keeps_promises({5: 1, 6: 1}, {6: 1}, steps_done=4, batch=1)


def test_old_train_by_steps_with_nothing_left_do_not_block() -> None:
    assert step_keeps_promises({3: 1, 4: 1}, {3: 1, 4: 1}, steps_done=2, batch=1)
