"""A payload lost with its holder: the core rolls the group back to the stage that made it."""

from __future__ import annotations

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.scheduler.core import SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state, load_state
from asyncrl.runtime.scheduler.core.effects import Accepted, Rejected

from .test_core import grant, make_core

REF = ["gen", "tcp://127.0.0.1:1", "store", 1, 100, 7]  # what the service keeps of a reference


def generated_with_refs(core: SchedulerCore, keys: list[str]) -> None:
    core.add_groups(keys)
    lease = grant(core.claim("generate", "gen", len(keys), 0.0))
    n = len(lease.groups)
    assert core.complete(lease.lease_id, lease.fence, list(lease.groups), [(0, 0)] * n, [REF] * n)


def complete(core: SchedulerCore, role: str, worker: str, n: int = 100) -> None:
    lease = grant(core.claim(role, worker, n, 0.0))
    data = [[worker, "addr", "s", gid, 10, 1] for gid in lease.groups]
    assert isinstance(
        core.complete(lease.lease_id, lease.fence, list(lease.groups), None, data), Accepted
    )


def test_a_lost_rollout_sends_the_group_back_to_be_generated_and_drops_what_came_of_it() -> None:
    core = make_core(max_attempts=3)
    generated_with_refs(core, ["a", "b"])
    complete(core, "reward", "rw")
    logp = grant(core.claim("logp", "lp", 100, 0.0))
    ref = grant(core.claim("ref_logp", "ref", 100, 0.0))
    reply = core.fail(logp.lease_id, logp.fence, None, "fetch failed", [(0, "generate", "gone")])
    assert reply == Accepted(2)
    a, b = core.state.groups[0], core.state.groups[1]
    assert a.state == "pending" and set(a.data) == set() and a.behaviour is None
    assert a.attempts == {"generate": 1} and a.leases == {}  # ref_logp let go of it too
    assert b.state == "generated" and b.attempts == {} and "logp" not in b.leases
    assert b.done == {"reward"} and "ref_logp" in b.leases
    assert core.state.leases[ref.lease_id].gids == {1}
    assert core.state.regenerated == {"generate": 1}
    # ref_logp's completion of the rolled-back group is refused: it read the lost rollout
    late = core.complete(ref.lease_id, ref.fence, [0, 1])
    assert isinstance(late, Rejected) and late.reason is Reason.NOT_IN_LEASE
    # regenerated, it goes all the way again with fresh payloads
    again = grant(core.claim("generate", "gen", 1, 0.0))
    assert again.groups == (0,)


def test_a_lost_branch_payload_is_made_again_alone_even_after_the_join() -> None:
    core = make_core(max_attempts=3, train_batch_groups=1)
    generated_with_refs(core, ["a"])
    for role, worker in (("logp", "lp"), ("ref_logp", "ref"), ("reward", "rw")):
        complete(core, role, worker)
    assert core.state.groups[0].state == "ready"
    step = grant(core.claim("train", "tr", 1, 0.0))
    assert core.fail(step.lease_id, step.fence, None, "fetch", [(0, "logp", "corrupt")])
    group = core.state.groups[0]
    assert group.state == "generated" and group.done == {"ref_logp", "reward"}
    assert set(group.data) == {"generate", "ref_logp", "reward"}
    assert step.lease_id not in core.state.leases and group.attempts == {"logp": 1}
    assert core.state.due_ready == {} and core.state.counts["ready"] == 0
    complete(core, "logp", "lp")
    assert core.state.groups[0].state == "ready"
    assert isinstance(core.claim("train", "tr", 1, 0.0), type(step))


def test_the_rest_of_the_lease_goes_back_uncounted() -> None:
    core = make_core(max_attempts=3, train_batch_groups=2)
    generated_with_refs(core, ["a", "b"])
    for role, worker in (("logp", "lp"), ("ref_logp", "ref"), ("reward", "rw")):
        complete(core, role, worker)
    step = grant(core.claim("train", "tr", 2, 0.0))
    core.fail(step.lease_id, step.fence, None, "fetch", [(1, "reward", "gone")])
    a, b = core.state.groups[0], core.state.groups[1]
    assert a.state == "ready" and a.attempts == {}
    assert b.state == "generated" and b.attempts == {"reward": 1}


def test_a_payload_lost_too_often_kills_the_group() -> None:
    core = make_core(max_attempts=2)
    generated_with_refs(core, ["a"])
    lease = grant(core.claim("logp", "lp", 1, 0.0))
    core.fail(lease.lease_id, lease.fence, None, "x", [(0, "generate", "gone")])
    lease = grant(core.claim("generate", "gen", 1, 0.0))
    core.complete(lease.lease_id, lease.fence, [0], [(0, 0)], [REF])
    lease = grant(core.claim("logp", "lp", 1, 0.0))
    core.fail(lease.lease_id, lease.fence, None, "x", [(0, "generate", "gone again")])
    group = core.state.groups[0]
    assert group.state == "dead" and "gone again" in group.reason


def test_claims_of_loss_that_do_not_fit_the_lease_are_refused() -> None:
    core = make_core()
    generated_with_refs(core, ["a", "b"])
    lease = grant(core.claim("logp", "lp", 1, 0.0))
    for lost in ([(0, "reward", "x")], [(0, "logp", "x")]):
        reply = core.fail(lease.lease_id, lease.fence, None, "x", lost)
        assert isinstance(reply, Rejected), lost
    assert core.state.groups[0].state == "generated" and core.state.regenerated == {}


def test_a_replayed_journal_and_a_snapshot_agree_on_losses() -> None:
    core = make_core(max_attempts=3)
    generated_with_refs(core, ["a"])
    lease = grant(core.claim("reward", "rw", 1, 0.0))
    core.fail(lease.lease_id, lease.fence, None, "x", [(0, "generate", "gone")])
    records, _ = core.drain()
    settings = core.settings
    replayed = SchedulerCore.restore(settings, records)
    assert replayed.state.regenerated == {"generate": 1}
    assert replayed.state.groups[0].state == "pending"
    reloaded = load_state(core.pipeline, dict(settings.resources), dump_state(core.state))
    assert reloaded.regenerated == {"generate": 1} and reloaded.groups[0].data == {}


def test_a_second_reader_reporting_the_same_loss_gives_its_lease_back_uncounted() -> None:
    core = make_core(max_attempts=3)
    generated_with_refs(core, ["a", "b"])
    logp = grant(core.claim("logp", "lp", 1, 0.0))  # group 0
    reward = grant(core.claim("reward", "rw", 2, 0.0))  # groups 0 and 1
    core.fail(logp.lease_id, logp.fence, None, "x", [(0, "generate", "corrupt")])
    assert core.state.leases[reward.lease_id].gids == {1}
    reply = core.fail(reward.lease_id, reward.fence, None, "x", [(0, "generate", "corrupt")])
    assert reply == Accepted(1)
    assert core.state.regenerated == {"generate": 1}
    assert core.state.groups[1].attempts == {} and core.state.groups[1].state == "generated"
