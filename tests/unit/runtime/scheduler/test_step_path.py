"""A train step's critical path from the moments the scheduler sees (times made up)."""

from __future__ import annotations

from asyncrl.runtime.contract.stages import GroupState as S
from asyncrl.runtime.scheduler.core.effects import Transition
from asyncrl.runtime.scheduler.service.step_path import StepPath


def path() -> StepPath:
    return StepPath(S.READY, S.TRAINING)


def test_the_batch_is_ready_when_its_last_group_is_and_each_leg_is_a_difference() -> None:
    sp = path()
    sp.moved([Transition(S.GENERATED, S.READY, (1,))], now=3.0)
    sp.moved([Transition(S.GENERATED, S.READY, (2, 3))], now=5.0)
    sp.moved([Transition(S.READY, S.TRAINING, (1, 2))], now=6.0)
    sp.leased(lease_id=7, now=6.0)
    assert sp.trained(1, 7, [1, 2], now=9.5) == {
        "ready_to_leased_s": 1.0,
        "leased_to_trained_s": 3.5,
    }
    sp.published(1, now=9.75)
    assert sp.take_reached() == []  # no generator runs it yet
    sp.loaded_everywhere(1, now=10.0)
    assert sp.take_reached() == [
        {"step": 1, "trained_to_published_s": 0.25, "published_to_loaded_s": 0.25}
    ]
    assert sp.take_reached() == []  # each step once


def test_the_part_of_the_wait_the_trainer_spent_on_the_step_before_is_told_apart() -> None:
    sp = path()
    sp.leased(1, now=0.0)
    sp.trained(1, 1, [], now=9.5)
    sp.moved([Transition(S.GENERATED, S.READY, (5, 6))], now=9.0)  # ready while it trained
    sp.published(1, now=9.75)  # the trainer's last move before it claims again
    sp.leased(2, now=10.0)
    legs = sp.trained(2, 2, [5, 6], now=11.0)
    assert legs["ready_to_leased_s"] == 1.0 and legs["trainer_busy_s"] == 0.75
    sp.published(2, now=11.5)
    sp.moved([Transition(S.GENERATED, S.READY, (7,))], now=12.0)  # the trainer was idle
    sp.leased(3, now=12.25)
    legs = sp.trained(3, 3, [7], now=13.0)
    assert legs["ready_to_leased_s"] == 0.25 and legs["trainer_busy_s"] == 0.0


def test_a_group_back_from_a_failed_train_lease_keeps_its_first_ready_time() -> None:
    sp = path()
    sp.moved([Transition(S.GENERATED, S.READY, (1, 2))], now=1.0)
    sp.leased(4, now=2.0)
    sp.moved([Transition(S.READY, S.TRAINING, (1, 2))], now=2.0)
    sp.moved([Transition(S.TRAINING, S.READY, (1, 2), "lease expired")], now=8.0)
    sp.leased(5, now=8.5)
    legs = sp.trained(1, 5, [1, 2], now=9.0)
    assert legs == {"ready_to_leased_s": 7.5, "leased_to_trained_s": 0.5}  # the wait counts


def test_a_group_sent_back_upstream_is_ready_again_only_when_it_rejoins() -> None:
    sp = path()
    sp.moved([Transition(S.GENERATED, S.READY, (1,))], now=1.0)
    sp.moved([Transition(S.READY, S.PENDING, (1,), "payload lost")], now=2.0)
    sp.moved([Transition(S.GENERATED, S.READY, (1,))], now=6.0)
    sp.leased(1, now=7.0)
    assert sp.trained(1, 1, [1], now=8.0)["ready_to_leased_s"] == 1.0


def test_without_the_ready_moment_or_the_grant_a_leg_is_left_out() -> None:
    sp = path()
    assert sp.trained(1, 99, [1], now=5.0) == {}  # no grant seen (a restart in between)
    sp.leased(2, now=6.0)
    assert sp.trained(2, 2, [1], now=7.0) == {"leased_to_trained_s": 1.0}  # ready unknown
    sp.loaded_everywhere(2, now=8.0)  # step 2 published before we knew: one leg for both
    assert sp.take_reached() == [
        {"step": 1, "trained_to_loaded_s": 3.0},
        {"step": 2, "trained_to_loaded_s": 1.0},
    ]


def test_skipped_versions_are_reached_by_the_newer_one() -> None:
    sp = path()
    for step in (1, 2, 3):
        sp.trained(step, step, [], now=10.0 * step)
        sp.published(step, now=10.0 * step + 1)
    sp.loaded_everywhere(2, now=25.0)  # generators went from 0 straight to 2
    reached = sp.take_reached()
    assert [(r["step"], r["published_to_loaded_s"]) for r in reached] == [(1, 14.0), (2, 4.0)]
    sp.loaded_everywhere(2, now=26.0)  # a report again: nothing new
    assert sp.take_reached() == []


def test_what_waits_is_bounded() -> None:
    sp = StepPath(S.READY, S.TRAINING, keep=3)
    for step in range(1, 11):  # generators never report
        sp.leased(step, now=step)
        sp.trained(step, step, [], now=step + 0.5)
    sp.loaded_everywhere(10, now=20.0)
    assert [r["step"] for r in sp.take_reached()] == [8, 9, 10]
    for lease in range(100):  # grants whose steps never came
        sp.leased(1000 + lease, now=0.0)
    assert len(sp._leased_at) <= 16
