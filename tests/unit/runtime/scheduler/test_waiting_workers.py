"""Whom the scheduler wakes: one waiting worker per group that reaches its role's stage,
every waiting worker when a gate widens, each by its own topic."""

from __future__ import annotations

import pytest

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE
from asyncrl.runtime.scheduler.service.waiting import WaitingWorkers
from asyncrl.transport.topics import wake_topic

GENERATED = "transition.generating.generated"


def _waiting(*workers: tuple[str, str]) -> WaitingWorkers:
    waiting = WaitingWorkers(DEFAULT_PIPELINE)
    for role, worker in workers:
        waiting.found_nothing(role, worker)
    return waiting


def test_a_generated_group_wakes_one_waiting_scorer_of_each_role_oldest_first() -> None:
    waiting = _waiting(("logp", "logp-0"), ("logp", "logp-1"), ("reward", "reward-0"))
    woken = list(waiting.to_wake([(GENERATED, {"groups": ["g1"]})]))
    assert woken == [wake_topic("logp-0"), wake_topic("reward-0")]
    assert waiting.waiting("logp") == 1 and waiting.waiting("reward") == 0
    # Woken workers wait no longer: the next group wakes the one left.
    assert list(waiting.to_wake([(GENERATED, {"groups": ["g2"]})])) == [wake_topic("logp-1")]


def test_as_many_are_woken_as_groups_came_and_no_more_than_wait() -> None:
    waiting = _waiting(*(("logp", f"logp-{i}") for i in range(5)))
    woken = list(waiting.to_wake([(GENERATED, {"groups": ["a", "b"]}),
                                  (GENERATED, {"groups": ["c"]})]))  # fmt: skip
    assert woken == [wake_topic(f"logp-{i}") for i in range(3)]
    many = list(waiting.to_wake([(GENERATED, {"groups": [str(i) for i in range(50)]})]))
    assert many == [wake_topic("logp-3"), wake_topic("logp-4")]


def test_moves_elsewhere_in_the_pipeline_wake_nobody() -> None:
    waiting = _waiting(("logp", "logp-0"), ("generate", "generate-0"))
    assert list(waiting.to_wake([("transition.pending.generating", {"groups": ["g"]})])) == []
    assert list(waiting.to_wake([("version.loaded", {"worker": "x", "version": 1})])) == []
    assert waiting.waiting("logp") == 1 and waiting.waiting("generate") == 1


def test_a_widened_gate_wakes_every_waiting_worker_of_the_role() -> None:
    waiting = _waiting(*(("generate", f"generate-{i}") for i in range(3)), ("logp", "logp-0"))
    woken = list(waiting.to_wake([("version.published", {"version": 4})]))
    assert woken == [wake_topic(f"generate-{i}") for i in range(3)]
    assert waiting.waiting("logp") == 1  # a version brings no group to score


def test_the_entry_role_wakes_whole_when_room_opens() -> None:
    waiting = _waiting(("dataloader", "dataloader-0"), ("dataloader", "dataloader-1"))
    woken = list(waiting.to_wake([("transition.pending.generating", {"groups": ["g"]})]))
    assert woken == [wake_topic("dataloader-0"), wake_topic("dataloader-1")]


def test_a_worker_that_claimed_or_left_is_not_woken() -> None:
    waiting = _waiting(("logp", "logp-0"), ("logp", "logp-1"))
    waiting.claimed("logp-0")  # it asked again (and got work)
    waiting.claimed("nobody")  # unknown: nothing to do
    assert list(waiting.to_wake([(GENERATED, {"groups": ["g"]})])) == [wake_topic("logp-1")]


def test_finding_nothing_again_moves_a_worker_to_the_back() -> None:
    waiting = _waiting(("logp", "logp-0"), ("logp", "logp-1"))
    waiting.found_nothing("logp", "logp-0")
    assert list(waiting.to_wake([(GENERATED, {"groups": ["g"]})])) == [wake_topic("logp-1")]


def test_a_wake_topic_names_one_worker_under_prefix_matching() -> None:
    assert not wake_topic("generate-10").startswith(wake_topic("generate-1"))
    assert wake_topic("generate-node1.lab-0") == "wake.generate-node1.lab-0/"  # dots allowed
    with pytest.raises(ValueError, match="hold no '/'"):
        wake_topic("a/b")
