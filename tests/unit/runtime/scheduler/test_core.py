"""The scheduler core, scenario by scenario (the property tests cover the interleavings)."""

from __future__ import annotations

from itertools import pairwise

import pytest

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state, load_state
from asyncrl.runtime.scheduler.core.effects import (
    Accepted,
    Grant,
    LockGranted,
    LockQueued,
    Rejected,
    Transition,
)

ROLES = {"gen": "generate", "lp": "logp", "ref": "ref_logp", "rw": "reward", "tr": "train"}


def make_core(**overrides: object) -> SchedulerCore:
    settings = {"max_staleness": 1, "train_batch_groups": 2, "max_attempts": 2,
                "lease_timeout": 10.0, "worker_timeout": 30.0, "resources": {"gpu": 1}}  # fmt: skip
    core = SchedulerCore(CoreSettings(**{**settings, **overrides}))
    for worker, role in ROLES.items():
        assert isinstance(core.register(worker, role, 0.0), Accepted)
    core.loaded_version("gen", 0)
    return core


def grant(reply: object) -> Grant:
    assert isinstance(reply, Grant), reply
    return reply


def generate(core: SchedulerCore, n: int, now: float = 0.0) -> Grant:
    lease = grant(core.claim("generate", "gen", n, now))
    version = lease.version
    assert core.complete(lease.lease_id, lease.fence, list(lease.groups),
                         [(version, version)] * len(lease.groups))  # fmt: skip
    return lease


def score(core: SchedulerCore) -> None:
    for worker in ("lp", "ref", "rw"):
        lease = grant(core.claim(ROLES[worker], worker, 100, 0.0))
        assert core.complete(lease.lease_id, lease.fence, list(lease.groups))


def test_a_group_goes_all_the_way() -> None:
    core = make_core(train_batch_groups=1)
    core.add_groups(["a"])
    generate(core, 1)
    for worker in ("lp", "ref"):
        lease = grant(core.claim(ROLES[worker], worker, 1, 0.0))
        core.complete(lease.lease_id, lease.fence, list(lease.groups))
        assert core.state.groups[0].state == "generated"  # waits for every branch
    lease = grant(core.claim("reward", "rw", 1, 0.0))
    core.complete(lease.lease_id, lease.fence, [0])
    assert core.state.groups[0].state == "ready"
    step = grant(core.claim("train", "tr", 1, 0.0))
    assert core.complete(step.lease_id, step.fence, [0])
    assert core.state.counts["trained"] == 1 and core.state.steps_done == 1
    assert 0 not in core.state.groups  # trained groups leave the table: snapshots stay small
    moves = [(n.source, n.target) for n in core.drain()[1] if isinstance(n, Transition)]
    path = ["pending", "generating", "generated", "ready", "training", "trained"]
    assert moves == list(pairwise(path))


def test_train_takes_exactly_one_batch_oldest_first() -> None:
    core = make_core(train_batch_groups=2, max_staleness=3)
    core.add_groups(["a", "b", "c"])
    generate(core, 3)
    score(core)
    step = grant(core.claim("train", "tr", 99, 0.0))
    assert step.groups == (0, 1)
    assert core.claim("train", "tr", 99, 0.0) is None  # one step at a time
    core.complete(step.lease_id, step.fence, [0, 1])
    assert core.claim("train", "tr", 99, 0.0) is None  # one group left: not a batch


def test_synchronous_mode_waits_for_the_new_version() -> None:
    core = make_core(max_staleness=0, train_batch_groups=2)
    core.add_groups([f"p{i}" for i in range(6)])
    first = generate(core, 10)
    assert first.groups == (0, 1)  # exactly one batch in flight
    assert core.claim("generate", "gen", 10, 0.0) is None
    score(core)
    step = grant(core.claim("train", "tr", 2, 0.0))
    core.complete(step.lease_id, step.fence, list(step.groups))
    assert core.claim("generate", "gen", 10, 0.0) is None  # still on version 0
    core.publish_version("tr", 1)
    core.loaded_version("gen", 1)
    assert generate(core, 10).groups == (2, 3)


def test_an_expired_lease_returns_its_groups_and_its_fence_goes_stale() -> None:
    core = make_core()
    core.add_groups(["a", "b"])
    old = grant(core.claim("generate", "gen", 2, now=0.0))
    assert core.tick(10.0) == 1
    assert [g.state for g in core.state.groups.values()] == ["pending", "pending"]
    # silent as long as the lease lasted: the worker died holding two groups, so neither
    # is blamed; both are suspects, leased one per worker from now on
    assert [(g.attempts, g.suspects) for g in core.state.groups.values()] == [
        ({}, {"generate"}),
        ({}, {"generate"}),
    ]
    new = grant(core.claim("generate", "gen", 2, now=11.0))
    assert new.groups == (0,)
    late = core.complete(old.lease_id, old.fence, [0], [(0, 0)])
    assert isinstance(late, Rejected) and late.reason is Reason.STALE_FENCE
    assert core.rejections[Reason.STALE_FENCE] == 1
    assert core.state.groups[0].leases == {"generate": new.lease_id}


def test_heartbeat_renews_leases() -> None:
    core = make_core()
    core.add_groups(["a"])
    grant(core.claim("generate", "gen", 1, now=0.0))
    core.heartbeat("gen", 8.0)
    assert core.tick(12.0) == 0
    assert core.tick(18.0) == 1


def test_past_max_attempts_a_group_dies_with_its_reason() -> None:
    core = make_core(max_attempts=2)
    core.add_groups(["a"])
    for _ in range(2):
        lease = grant(core.claim("generate", "gen", 1, 0.0))
        assert core.fail(lease.lease_id, lease.fence, None, "CUDA out of memory")
    group = core.state.groups[0]
    assert group.state == "dead"
    assert group.reason == "generate: CUDA out of memory (attempt 2 of 2)"


def test_a_silent_worker_is_lost_and_its_work_returns() -> None:
    core = make_core(worker_timeout=5.0)
    core.add_groups(["a"])
    grant(core.claim("generate", "gen", 1, 0.0))
    for worker in ("lp", "ref", "rw", "tr"):
        core.heartbeat(worker, 4.0)
    core.tick(6.0)
    assert "gen" not in core.state.workers
    assert core.state.groups[0].state == "pending"
    refused = core.claim("generate", "gen", 1, 6.0)
    assert isinstance(refused, Rejected) and refused.reason is Reason.UNKNOWN_WORKER


def test_locks_queue_and_follow_their_lease() -> None:
    core = make_core(max_staleness=3)
    core.add_groups(["a", "b"])
    generate(core, 2)
    first = grant(core.claim("logp", "lp", 1, 0.0))
    second = grant(core.claim("ref_logp", "ref", 1, 0.0))
    taken = core.acquire("gpu", first.lease_id, first.fence)
    queued = core.acquire("gpu", second.lease_id, second.fence)
    assert isinstance(taken, LockGranted) and isinstance(queued, LockQueued)
    core.fail(first.lease_id, first.fence, None, "killed")  # losing the lease frees the lock
    holders = core.state.resources["gpu"].holders
    assert list(holders.values()) == [second.lease_id]
    stale = core.release("gpu", taken.token)
    assert isinstance(stale, Rejected) and stale.reason is Reason.STALE_FENCE


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (lambda c: c.claim("train", "gen", 1, 0.0), Reason.WRONG_ROLE),
        (lambda c: c.claim("generate", "nobody", 1, 0.0), Reason.UNKNOWN_WORKER),
        (lambda c: c.claim("generate", "gen", 0, 0.0), Reason.BAD_REQUEST),
        (lambda c: c.complete(99, 1, [0]), Reason.UNKNOWN_LEASE),
        (lambda c: c.register("x", "critic", 0.0), Reason.WRONG_ROLE),
        (lambda c: c.add_groups(["a", "a"]), Reason.DUPLICATE_KEY),
        (lambda c: c.publish_version("tr", 1), Reason.BAD_VERSION),
        (lambda c: c.publish_version("gen", 0), Reason.WRONG_ROLE),
        (lambda c: c.loaded_version("gen", 5), Reason.BAD_VERSION),
        (lambda c: c.release("disk", 1), Reason.UNKNOWN_RESOURCE),
    ],
)
def test_bad_commands_are_refused_without_a_change(call, reason: Reason) -> None:
    core = make_core()
    core.drain()
    before = dump_state(core.state)
    reply = call(core)
    assert isinstance(reply, Rejected) and reply.reason is reason, reply
    assert dump_state(core.state) == before and core.drain()[0] == []


def test_generation_versions_are_checked() -> None:
    core = make_core()
    core.add_groups(["a"])
    lease = grant(core.claim("generate", "gen", 1, 0.0))
    for versions in ([(0, 1)], [(1, 0)], [(0, 0), (0, 0)], None):
        reply = core.complete(lease.lease_id, lease.fence, [0], versions)
        assert isinstance(reply, Rejected), versions
    assert core.complete(lease.lease_id, lease.fence, [0], [(0, 0)])


def test_restore_equals_live_and_resume_grants_grace() -> None:
    core = make_core()
    core.add_groups(["a", "b", "c"])
    generate(core, 1)
    grant(core.claim("generate", "gen", 2, now=0.0))
    records, _ = core.drain()
    again = SchedulerCore.restore(core.settings, records)
    assert dump_state(again.state) == dump_state(core.state)
    again.resume(now=100.0)
    assert again.tick(105.0) == 0  # leases got a fresh deadline
    assert again.tick(110.0) == 1


def test_a_grant_lost_in_a_crash_never_matches_a_new_one() -> None:
    core = make_core()
    core.add_groups(["a", "b"])
    journaled, _ = core.drain()
    lost = grant(core.claim("generate", "gen", 1, now=0.0))  # its record never hit the disk
    again = SchedulerCore.restore(core.settings, journaled)
    again.resume(now=1.0)
    fresh = grant(again.claim("generate", "gen", 1, now=1.0))
    assert (fresh.lease_id, fresh.fence) != (lost.lease_id, lost.fence)
    late = again.complete(lost.lease_id, lost.fence, list(lost.groups), [(0, 0)])
    assert isinstance(late, Rejected) and late.reason is Reason.STALE_FENCE


def test_payloads_travel_with_their_group_and_leave_with_it() -> None:
    core = make_core(train_batch_groups=1)
    core.add_groups(["a"], [{"prompt": "1+1"}])
    gen = grant(core.claim("generate", "gen", 1, now=0.0))
    assert core.complete(gen.lease_id, gen.fence, [0], [(0, 0)], [{"tokens": [5, 6]}])
    group = core.state.groups[0]
    assert group.data == {"dataloader": {"prompt": "1+1"}, "generate": {"tokens": [5, 6]}}
    journaled, _ = core.drain()
    assert SchedulerCore.restore(core.settings, journaled).state.groups[0].data == group.data
    reloaded = load_state(core.pipeline, {"gpu": 1}, dump_state(core.state))
    assert reloaded.groups[0].data == group.data
    for worker, role in (("lp", "logp"), ("ref", "ref_logp"), ("rw", "reward")):
        lease = grant(core.claim(role, worker, 1, now=0.0))
        assert core.complete(lease.lease_id, lease.fence, [0], data=[{role: 1.0}])
    assert set(core.state.groups[0].data) == {"dataloader", *ROLES.values()} - {"train"}
    step = grant(core.claim("train", "tr", 1, now=0.0))
    assert core.complete(step.lease_id, step.fence, [0])
    assert 0 not in core.state.groups  # trained: its data is gone with it


def test_payload_counts_must_match() -> None:
    core = make_core()
    assert core.add_groups(["a", "b"], [{}]).reason is Reason.BAD_REQUEST
    core.add_groups(["a"])
    gen = grant(core.claim("generate", "gen", 1, now=0.0))
    bad = core.complete(gen.lease_id, gen.fence, [0], [(0, 0)], [{}, {}])
    assert isinstance(bad, Rejected) and bad.reason is Reason.BAD_RESULT


def test_a_heartbeat_renews_only_the_leases_the_worker_says_it_holds() -> None:
    core = make_core(lease_timeout=10.0, worker_timeout=100.0)
    core.add_groups(["a", "b"])
    kept = grant(core.claim("generate", "gen", 1, now=0.0))
    lost = grant(core.claim("generate", "gen", 1, now=0.0))  # its reply never arrived
    assert core.heartbeat("gen", 8.0, held=[kept.lease_id]) == Accepted(1)
    assert core.tick(12.0) == 1  # the unheld lease ran out; the held one was renewed
    assert set(core.state.leases) == {kept.lease_id}
    assert core.state.groups[lost.groups[0]].state.value == "pending"
