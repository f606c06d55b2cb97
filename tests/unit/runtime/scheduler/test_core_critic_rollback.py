"""The critic rolls back (its host was lost; only an older critic checkpoint survived):
the core's rule, scenario by scenario (tests/property drives it in random interleavings)."""

from __future__ import annotations

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import GroupState
from asyncrl.runtime.scheduler.core import SchedulerCore
from asyncrl.runtime.scheduler.core import journal_records as r
from asyncrl.runtime.scheduler.core.codec import dump_state
from asyncrl.runtime.scheduler.core.effects import (
    Accepted,
    CriticRolledBackTo,
    Rejected,
    RolledBackTo,
    WorkerLost,
)
from tests.unit.runtime.scheduler.test_core_critic import PPO, done, grant, make_core, run, to_ready


def three_critic_steps(core: SchedulerCore) -> None:
    """Critic steps 1..3, each published and loaded by the values worker: groups 0..5
    critic-trained, and 6, 7 ready with values of critic version 3."""
    for version in (1, 2, 3):
        to_ready(core, 2)
        done(core, grant(core.claim("critic", "cr", 99, 0.0)))
        assert isinstance(core.publish_version("cr", version), Accepted)
        assert isinstance(core.loaded_version("val", version), Accepted)
    to_ready(core, 2)
    assert {core.state.groups[g].critic_version for g in (6, 7)} == {3}


def test_the_critic_goes_back_and_values_of_lost_versions_are_made_again() -> None:
    core = make_core(max_staleness=3)
    three_critic_steps(core)
    core.drain()
    assert isinstance(core.rewind("cr", 1), Accepted)
    s = core.state
    assert (s.critic_steps_done, s.critic_version) == (1, 1)
    assert (s.steps_done, s.policy_version) == (0, 0)  # the policy's counts stay
    # The values worker ran on version 3, lost: it leaves, to load one that exists.
    assert "val" not in s.workers
    records, notices = core.drain()
    assert WorkerLost("val", "the critic rolled back from step 3 to 1") in notices
    assert CriticRolledBackTo(1, "the critic rolled back from step 3 to 1") in notices
    assert not any(isinstance(n, RolledBackTo) for n in notices)
    assert [r.Op.ROLL_BACK, 1, "the critic rolled back from step 3 to 1", True] in [
        list(x) for x in records
    ]
    # Groups still to meet the critic wait for their values alone, made afresh.
    for gid in (6, 7):
        assert s.groups[gid].state == GroupState.GENERATED
        assert s.groups[gid].done == {"logp", "reward"}
        assert s.groups[gid].critic_version is None
    assert s.regenerated["values"] == 2
    # The critic trained the others already: they keep their values for the train step.
    assert {s.groups[g].state for g in range(6)} == {GroupState.CRITIC_TRAINED}
    assert [s.groups[g].critic_version for g in range(6)] == [0, 0, 1, 1, 2, 2]


def test_after_the_critic_rolled_back_it_steps_and_publishes_from_there() -> None:
    core = make_core(max_staleness=3)
    three_critic_steps(core)
    core.rewind("cr", 1)
    assert isinstance(core.loaded_version("cr", 2), Rejected)  # not a version any more
    core.register("val", "values", 0.0)
    assert isinstance(core.loaded_version("val", 2), Rejected)
    assert isinstance(core.loaded_version("val", 1), Accepted)
    assert run(core, "val", 2).version == 1
    step = grant(core.claim("critic", "cr", 99, 0.0))
    assert step.version == 1 and set(step.groups) == {6, 7}
    done(core, step)
    assert isinstance(core.publish_version("cr", 2), Accepted)
    assert core.state.critic_steps_done == 2 and core.state.worst_critic_staleness <= 3


def test_a_critic_step_in_flight_is_given_back_uncounted() -> None:
    core = make_core(max_staleness=3)
    three_critic_steps(core)
    step = grant(core.claim("critic", "cr", 99, 0.0))
    assert set(step.groups) == {6, 7}
    assert isinstance(core.rewind("cr", 2), Accepted)
    s = core.state
    assert step.lease_id not in s.leases
    for gid in (6, 7):  # back from critic_training, then to their values (of version 3)
        assert s.groups[gid].state == GroupState.GENERATED
        assert s.groups[gid].attempts == {}


def test_a_values_worker_on_a_kept_version_stays() -> None:
    core = make_core(max_staleness=3)
    three_critic_steps(core)
    core.register("val", "values", 0.0)
    core.loaded_version("val", 2)
    assert isinstance(core.rewind("cr", 2), Accepted)
    assert core.state.workers["val"].loaded == 2
    assert core.state.critic_version == 2
    # values of version 3 were made again; none of 2 or older were
    assert core.state.regenerated["values"] == 2


def test_a_rewind_that_makes_no_sense_is_refused_and_changes_nothing() -> None:
    core = make_core(max_staleness=3)
    three_critic_steps(core)
    before = dump_state(core.state)
    for worker, step, reason in [
        ("cr", 3, Reason.BAD_VERSION),  # not behind the critic's count
        ("cr", -1, Reason.BAD_VERSION),
        ("val", 1, Reason.WRONG_ROLE),  # only the trainer or the critic rolls back
        ("nobody", 1, Reason.UNKNOWN_WORKER),
        ("tr", 1, Reason.BAD_VERSION),  # the policy has no step 1 to go back from
    ]:
        reply = core.rewind(worker, step)
        assert isinstance(reply, Rejected) and reply.reason is reason, (worker, reply)
    assert dump_state(core.state) == before
    core.register("cr2", "critic", 0.0)
    grant(core.claim("critic", "cr", 99, 0.0))
    before = dump_state(core.state)
    refused = core.rewind("cr2", 1)
    assert isinstance(refused, Rejected) and "another critic" in refused.detail
    assert dump_state(core.state) == before


def test_replay_rebuilds_a_critic_rolled_back() -> None:
    core = make_core(max_staleness=3)
    journal: list = []
    three_critic_steps(core)
    core.rewind("cr", 1)
    records, _ = core.drain()
    journal.extend(records)
    replayed = SchedulerCore.restore(core.settings, journal, PPO)
    assert dump_state(replayed.state) == dump_state(core.state)
    assert (replayed.state.critic_steps_done, replayed.state.critic_version) == (1, 1)
