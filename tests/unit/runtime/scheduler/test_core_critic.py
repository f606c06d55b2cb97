"""The scheduler core with a learned critic (Pipeline.with_critic), scenario by scenario:
the values branch, the critic's step and its own versions, and its staleness bound (the
property tests in tests/property cover the interleavings)."""

from __future__ import annotations

import pytest

from asyncrl.runtime.contract.bus import wakeup_topics
from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import (
    DEFAULT_PIPELINE,
    Gate,
    GroupState,
    Pipeline,
    PipelineError,
    Role,
    Stage,
)
from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state
from asyncrl.runtime.scheduler.core.effects import Accepted, Grant, Rejected, VersionPublished
from asyncrl.runtime.scheduler.core.status import summarize
from asyncrl.runtime.scheduler.status_text import render_status

PPO = DEFAULT_PIPELINE.with_critic().without(Role.REF_LOGP)
ROLES = {"gen": "generate", "lp": "logp", "rw": "reward", "val": "values", "cr": "critic",
         "tr": "train"}  # fmt: skip


def make_core(**overrides: object) -> SchedulerCore:
    settings = {"max_staleness": 1, "train_batch_groups": 2, "max_attempts": 2,
                "lease_timeout": 10.0, "worker_timeout": 30.0, "resources": {}}  # fmt: skip
    core = SchedulerCore(CoreSettings(**{**settings, **overrides}), PPO)
    for worker, role in ROLES.items():
        assert isinstance(core.register(worker, role, 0.0), Accepted)
    assert isinstance(core.loaded_version("gen", 0), Accepted)
    assert isinstance(core.loaded_version("val", 0), Accepted)
    return core


def grant(reply: object) -> Grant:
    assert isinstance(reply, Grant), reply
    return reply


def done(core: SchedulerCore, lease: Grant, behaviour: bool = False) -> None:
    gids = list(lease.groups)
    versions = [(lease.version, lease.version)] * len(gids) if behaviour else None
    assert isinstance(core.complete(lease.lease_id, lease.fence, gids, versions), Accepted)


def to_ready(core: SchedulerCore, n: int) -> list[int]:
    """``n`` new groups generated and scored by every branch: ready for the critic."""
    first = core.state.next_gid
    core.add_groups([f"g{first + i}" for i in range(n)])
    done(core, grant(core.claim("generate", "gen", n, 0.0)), behaviour=True)
    for worker in ("lp", "rw", "val"):
        done(core, grant(core.claim(ROLES[worker], worker, n, 0.0)))
    gids = list(range(first, first + n))
    assert {core.state.groups[g].state for g in gids} == {GroupState.READY}
    return gids


def test_the_table_puts_values_beside_logp_and_the_critic_before_the_train_step() -> None:
    rows = {s.role: (s.source, s.working, s.target, s.gate) for s in PPO.stages}
    assert rows["values"] == (GroupState.GENERATED, None, GroupState.READY, Gate.FREE)
    assert rows["critic"] == (
        GroupState.READY,
        GroupState.CRITIC_TRAINING,
        GroupState.CRITIC_TRAINED,
        Gate.CRITIC_STEP,
    )
    assert rows["train"][0] == GroupState.CRITIC_TRAINED
    assert PPO.reads(PPO.stage_at(GroupState.READY, "critic")) == {"generate", "reward", "values"}
    assert "values" in PPO.reads(PPO.gated(Gate.STEP))


def test_a_table_that_reads_the_critic_needs_one_that_trains_it() -> None:
    values = Stage("values", GroupState.GENERATED, GroupState.READY, reads_critic=True)
    with pytest.raises(PipelineError, match="reads the critic, but no stage trains one"):
        Pipeline((*DEFAULT_PIPELINE.stages, values))
    with pytest.raises(PipelineError, match="a critic already"):
        PPO.with_critic()


def test_the_values_lease_carries_the_critic_version_its_worker_loaded() -> None:
    core = make_core()
    core.add_groups(["a"])
    done(core, grant(core.claim("generate", "gen", 1, 0.0)), behaviour=True)
    lease = grant(core.claim("values", "val", 1, 0.0))
    assert lease.version == 0
    done(core, lease)
    assert core.state.groups[0].critic_version == 0


def test_the_critic_steps_on_a_batch_and_counts_its_own_versions() -> None:
    core = make_core()
    to_ready(core, 3)
    step = grant(core.claim("critic", "cr", 99, 0.0))
    assert step.groups == (0, 1) and step.version == 0  # a batch, earliest due first
    assert core.claim("critic", "cr", 99, 0.0) is None  # one step at a time
    partial = core.complete(step.lease_id, step.fence, [0], None)
    assert isinstance(partial, Rejected) and partial.reason is Reason.INCOMPLETE_STEP
    done(core, step)
    s = core.state
    assert (s.critic_steps_done, s.steps_done) == (1, 0)
    assert s.counts[GroupState.CRITIC_TRAINED] == 2
    train = grant(core.claim("train", "tr", 99, 0.0))
    assert train.groups == (0, 1)
    assert s.worst_critic_staleness == 0  # values of v0 at the step from v0


def test_only_the_critic_publishes_critic_versions_and_only_values_workers_load_them() -> None:
    core = make_core()
    assert isinstance(core.publish_version("cr", 1), Rejected)  # no critic step yet
    to_ready(core, 2)
    done(core, grant(core.claim("critic", "cr", 99, 0.0)))
    assert isinstance(core.loaded_version("val", 1), Rejected)  # not published yet
    assert isinstance(core.publish_version("cr", 1), Accepted)
    assert core.state.critic_version == 1 and core.state.policy_version == 0
    assert VersionPublished(1, critic=True) in core.drain()[1]
    assert isinstance(core.loaded_version("val", 1), Accepted)
    assert isinstance(core.loaded_version("gen", 1), Rejected)  # the policy has no v1
    refused = core.publish_version("val", 1)
    assert isinstance(refused, Rejected) and refused.reason is Reason.WRONG_ROLE


def run(core: SchedulerCore, worker: str, n: int = 1) -> Grant:
    """``worker`` claims ``n`` and completes what it got."""
    lease = grant(core.claim(ROLES[worker], worker, n, 0.0))
    done(core, lease, behaviour=worker == "gen")
    return lease


def stale_values(core: SchedulerCore) -> None:
    """Group 1's values made with critic v0, then two critic steps before it is ready.

    With max_staleness 1 and a batch of 1, the critic step from version 2 may use values
    of version 1 or 2, not 0.
    """
    core.add_groups(["a", "b", "c"])
    run(core, "gen", 2)  # groups 0, 1 (the bound admits two at v0)
    for worker in ("lp", "rw", "val", "cr"):
        run(core, worker)  # group 0 through the critic: step 1
    core.publish_version("cr", 1)
    assert run(core, "val").groups == (1,)  # made with v0 (still loaded), within the bound
    run(core, "lp")
    reward = grant(core.claim("reward", "rw", 1, 0.0))  # group 1's reward, still running
    run(core, "tr")  # the policy's step 1 on group 0 admits group 2
    core.publish_version("tr", 1)
    core.loaded_version("gen", 1)
    run(core, "gen")
    core.loaded_version("val", 1)
    for worker in ("lp", "rw", "val", "cr"):
        assert run(core, worker).groups == (2,)  # group 2: critic step 2, from v1
    core.publish_version("cr", 2)
    done(core, reward)  # group 1 ready, with values of critic v0


def test_values_older_than_the_bound_are_made_again_before_the_critic_takes_them() -> None:
    core = make_core(max_staleness=1, train_batch_groups=1)
    stale_values(core)
    s = core.state
    assert s.groups[1].state == GroupState.READY and s.groups[1].critic_version == 0
    assert core.claim("critic", "cr", 99, 0.0) is None
    assert s.groups[1].state == GroupState.GENERATED
    assert s.groups[1].done == {"logp", "reward"}  # waiting for its values alone
    assert s.groups[1].critic_version is None and s.regenerated["values"] == 1
    # A values worker on v0 would make values too stale for the next critic step.
    core.register("val", "values", 0.0)
    core.loaded_version("val", 0)
    assert core.claim("values", "val", 99, 0.0) is None
    core.loaded_version("val", 2)
    assert run(core, "val").version == 2
    step = run(core, "cr")
    assert step.groups == (1,) and step.version == 2
    assert s.worst_critic_staleness == 0  # every step used values of its own version


def test_the_critic_takes_fewer_than_a_batch_only_to_complete_a_waiting_train_step() -> None:
    core = make_core(max_staleness=3)
    to_ready(core, 3)
    done(core, grant(core.claim("critic", "cr", 99, 0.0)))  # 0, 1 critic-trained
    train = grant(core.claim("train", "tr", 99, 0.0))
    assert core.claim("critic", "cr", 99, 0.0) is None  # group 2 alone, a step in flight
    done(core, train)
    core.publish_version("tr", 1)
    # The train step waits, but group 2 alone cannot make its batch: no step of one group.
    assert core.claim("critic", "cr", 99, 0.0) is None
    to_ready(core, 1)
    assert grant(core.claim("critic", "cr", 99, 0.0)).groups == (2, 3)


def test_no_short_critic_step_while_a_group_the_train_step_must_take_is_upstream() -> None:
    # As ppo.yaml runs: the critic's step makes the values, no values stage.
    table = DEFAULT_PIPELINE.with_critic(values_stage=False).without(Role.REF_LOGP)
    core = SchedulerCore(make_core().settings, table)  # max_staleness 1, batches of 2
    workers = {"gen": "generate", "lp": "logp", "rw": "reward", "rw2": "reward",
               "cr": "critic", "tr": "train"}  # fmt: skip
    for worker, role in workers.items():
        core.register(worker, role, 0.0)
    core.loaded_version("gen", 0)

    def through(n: int, *roles: str) -> None:
        done(core, grant(core.claim("generate", "gen", n, 0.0)), behaviour=True)
        for worker in roles:
            done(core, grant(core.claim(workers[worker], worker, n, 0.0)))

    core.add_groups(["g0", "g1"])
    through(2, "lp", "rw", "cr", "tr")
    core.publish_version("tr", 1)
    # Groups 2 and 3 from version 0 are due at step 2; 4 and 5 from version 1 at step 3.
    core.add_groups(["g2", "g3"])
    through(2, "lp")
    core.loaded_version("gen", 1)
    core.add_groups(["g4", "g5"])
    through(2, "lp")
    held = grant(core.claim("reward", "rw2", 1, 0.0))  # group 2's reward, still upstream
    assert held.groups == (2,)
    done(core, grant(core.claim("reward", "rw", 3, 0.0)))
    first = grant(core.claim("critic", "cr", 99, 0.0))
    assert first.groups == (3, 4)
    done(core, first)
    # The train step waits for group 2. Group 5 alone would complete a batch in number,
    # not one the train step may take: no short step for it.
    assert core.claim("train", "tr", 99, 0.0) is None
    assert core.claim("critic", "cr", 99, 0.0) is None
    done(core, held)
    step = grant(core.claim("critic", "cr", 99, 0.0))
    assert step.groups == (2, 5)  # one whole step, not two short ones
    done(core, step)
    assert grant(core.claim("train", "tr", 99, 0.0)).groups == (2, 3)
    assert core.state.critic_steps_done == 3


def test_a_group_whose_rollouts_were_lost_after_the_critic_step_is_taken_alone() -> None:
    core = make_core(max_staleness=3)
    to_ready(core, 2)
    done(core, grant(core.claim("critic", "cr", 99, 0.0)))
    train = grant(core.claim("train", "tr", 99, 0.0))
    # The trainer could not fetch group 1's rollouts: it is generated again, group 0 waits.
    lost = [(1, "generate", "its holder is gone")]
    assert isinstance(core.fail(train.lease_id, train.fence, None, "lost", lost), Accepted)
    assert core.state.groups[0].state is GroupState.CRITIC_TRAINED
    done(core, grant(core.claim("generate", "gen", 1, 0.0)), behaviour=True)
    for worker in ("lp", "rw", "val"):
        done(core, grant(core.claim(ROLES[worker], worker, 1, 0.0)))
    # Group 0 critic-trained and group 1 ready make the waiting train step's batch.
    critic = grant(core.claim("critic", "cr", 99, 0.0))
    assert critic.groups == (1,)
    done(core, critic)
    assert grant(core.claim("train", "tr", 99, 0.0)).groups == (0, 1)


def test_replay_and_snapshot_rebuild_the_critic_state() -> None:
    core = make_core(max_staleness=1, train_batch_groups=1)
    journal: list = []
    stale_values(core)
    core.claim("critic", "cr", 99, 0.0)  # group 1's values made again
    records, _ = core.drain()
    journal.extend(records)
    replayed = SchedulerCore.restore(core.settings, journal, PPO)
    assert dump_state(replayed.state) == dump_state(core.state)
    restored = SchedulerCore.restore(core.settings, [], PPO, dump_state(core.state))
    assert dump_state(restored.state) == dump_state(core.state)
    assert (restored.state.critic_steps_done, restored.state.critic_version) == (2, 2)


def test_the_status_names_the_critic_only_where_the_table_has_one() -> None:
    core = make_core()
    to_ready(core, 2)
    done(core, grant(core.claim("critic", "cr", 99, 0.0)))
    core.publish_version("cr", 1)
    critic = summarize(core.state)["critic"]
    assert critic == {"steps_done": 1, "version": 1, "worst_trained": 0}
    plain = SchedulerCore(core.settings)
    assert "critic" not in summarize(plain.state)


def test_the_status_screen_has_a_critic_line() -> None:
    core = make_core()
    to_ready(core, 2)
    done(core, grant(core.claim("critic", "cr", 99, 0.0)))
    summary = summarize(core.state)
    for worker in summary["workers"].values():
        worker["last_heartbeat_s_ago"] = 0.5
    summary |= {
        "run": {"name": "ppo", "steps": "0/10", "uptime_s": 1.0, "draining": None},
        "staleness": {"max_staleness": 1, "worst_trained": summary["worst_staleness_trained"]},
        "refused": {},
        "protocol_errors": 0,
        "journal": {"records": 1, "durable": 1},
    }
    lines = render_status(summary).splitlines()
    assert lines[3] == "critic    version 0, steps done 1, worst trained lag 0"


def test_the_critic_is_woken_by_ready_groups_and_by_a_train_step_that_may_wait() -> None:
    topics = wakeup_topics("critic", PPO)
    assert "transition.generated.ready" in topics  # groups it may take
    assert "transition.training.trained" in topics  # the train step may now wait for it
    assert "transition.generated.ready" in wakeup_topics("train", DEFAULT_PIPELINE)
    assert "transition.critic_training.critic_trained" in wakeup_topics("train", PPO)


# critic.values: step. The critic's step makes the values: no values row, and the train
# step reads the critic's result for its advantages.
PPO_STEP_VALUES = DEFAULT_PIPELINE.with_critic(values_stage=False).without(Role.REF_LOGP)


def test_without_a_values_stage_the_critic_takes_scored_groups_and_the_train_step_its_result() -> (
    None
):
    assert not PPO_STEP_VALUES.for_role("values")
    critic = PPO_STEP_VALUES.stage_at(GroupState.READY, "critic")
    assert PPO_STEP_VALUES.reads(critic) == {"generate", "reward"}
    assert "critic" in PPO_STEP_VALUES.reads(PPO_STEP_VALUES.gated(Gate.STEP))
    assert "values" not in PPO_STEP_VALUES.reads(PPO_STEP_VALUES.gated(Gate.STEP))
    settings = {"max_staleness": 1, "train_batch_groups": 2, "max_attempts": 2,
                "lease_timeout": 10.0, "worker_timeout": 30.0, "resources": {}}  # fmt: skip
    core = SchedulerCore(CoreSettings(**settings), PPO_STEP_VALUES)
    for worker, role in ROLES.items():
        if role != "values":
            assert isinstance(core.register(worker, role, 0.0), Accepted)
    assert isinstance(core.register("val", "values", 0.0), Rejected)  # no stage of its own
    assert isinstance(core.loaded_version("gen", 0), Accepted)
    core.add_groups(["a", "b"])
    done(core, grant(core.claim("generate", "gen", 2, 0.0)), behaviour=True)
    for worker in ("lp", "rw"):
        done(core, grant(core.claim(ROLES[worker], worker, 2, 0.0)))
    assert core.state.counts[GroupState.READY] == 2  # ready without values
    step = grant(core.claim("critic", "cr", 99, 0.0))
    assert step.groups == (0, 1) and step.version == 0
    done(core, step)
    assert core.state.critic_steps_done == 1
    train = grant(core.claim("train", "tr", 99, 0.0))
    assert train.groups == (0, 1)
    # The critic's process died with the values it made for group 1: the train step lets
    # go of the batch, and group 1 goes back to the critic's step alone, still admitted
    # (its rollouts, scores and train-by deadline kept), to have its values made again.
    train_by = core.state.groups[1].train_by
    gone = core.fail(train.lease_id, train.fence, None, "fetch failed", [(1, "critic", "gone")],
                     holder_gone=[(1, "critic")])  # fmt: skip
    assert isinstance(gone, Accepted)
    group = core.state.groups[1]
    assert group.state == GroupState.READY and group.train_by == train_by
    assert core.state.groups[0].state == GroupState.CRITIC_TRAINED
    again = grant(core.claim("critic", "cr", 99, 0.0))
    assert again.groups == (1,) and again.version == 1  # to complete the waiting train step
    done(core, again)
    assert grant(core.claim("train", "tr", 99, 0.0)).groups == (0, 1)
    # A critic rolled back with no values stage: nothing to make again, the count returns.
    assert isinstance(core.rewind("cr", 0), Accepted)
    assert core.state.critic_steps_done == 0
