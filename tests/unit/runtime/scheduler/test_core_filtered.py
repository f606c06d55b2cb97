"""Dynamic sampling in the core: a group the reward says carries no signal is filtered."""

from __future__ import annotations

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.scheduler.core import SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state, load_state
from asyncrl.runtime.scheduler.core.effects import Accepted, Rejected, Transition

from .test_core import generate, grant, make_core


def filter_first(
    core: SchedulerCore, why: str = "task reward 1 for all 8 responses", which: int = 0
) -> None:
    """Reward every generated group, the first (or ``which``) said to carry no signal."""
    lease = grant(core.claim("reward", "rw", 100, 0.0))
    verdicts = [why if i == which else None for i in range(len(lease.groups))]
    assert core.complete(lease.lease_id, lease.fence, list(lease.groups), filtered=verdicts)


def test_a_filtered_group_leaves_the_table_counted_with_its_reason() -> None:
    core = make_core(train_batch_groups=2, max_staleness=0)
    core.add_groups(["a", "b"])
    generate(core, 2)
    core.drain()
    filter_first(core)
    s = core.state
    assert 0 not in s.groups and s.counts["filtered"] == 1
    assert s.filtered_in_a_row == 0  # "b", judged after it, carries signal
    moves = [(n.source, n.target, n.groups, n.reason)
             for n in core.drain()[1] if isinstance(n, Transition)]  # fmt: skip
    assert ("generated", "filtered", (0,), "task reward 1 for all 8 responses") in moves


def test_its_slot_is_admitted_again_at_once_so_the_batch_fills() -> None:
    # synchronous: one batch of 2 in flight per step; a filtered group frees its promise
    core = make_core(train_batch_groups=2, max_staleness=0)
    core.add_groups(["a", "b", "c"])
    generate(core, 2)
    assert core.claim("generate", "gen", 1, 0.0) is None  # the step's two slots are taken
    filter_first(core)
    refill = grant(core.claim("generate", "gen", 1, 0.0))
    assert refill.groups == (2,)


def test_sibling_branches_let_go_and_their_late_results_are_ignored() -> None:
    core = make_core(train_batch_groups=1, max_staleness=2)
    core.add_groups(["a", "b"])
    generate(core, 2)
    logp = grant(core.claim("logp", "lp", 100, 0.0))  # holds both groups
    filter_first(core)
    lease = core.state.leases[logp.lease_id]
    assert lease.gids == {1} and lease.dropped == {0}
    # the logp worker could not know: its result for group 0 is dropped, group 1's taken
    assert core.complete(logp.lease_id, logp.fence, [0, 1]) == Accepted(1)
    assert core.state.groups[1].done == {"logp", "reward"}


def test_a_lease_whose_every_group_was_filtered_ends() -> None:
    core = make_core(train_batch_groups=1)
    core.add_groups(["a"])
    generate(core, 1)
    ref = grant(core.claim("ref_logp", "ref", 1, 0.0))
    filter_first(core)
    assert ref.lease_id not in core.state.leases
    late = core.complete(ref.lease_id, ref.fence, [0])
    assert isinstance(late, Rejected) and late.reason is Reason.STALE_FENCE  # dropped quietly


def test_only_a_filtering_stage_may_filter() -> None:
    core = make_core()
    core.add_groups(["a"])
    generate(core, 1)
    logp = grant(core.claim("logp", "lp", 1, 0.0))
    reply = core.complete(logp.lease_id, logp.fence, [0], filtered=["no"])
    assert isinstance(reply, Rejected) and reply.reason is Reason.BAD_RESULT


def test_the_bound_counts_filtered_groups_until_one_carries_signal() -> None:
    core = make_core(train_batch_groups=1, max_staleness=3, max_filtered_in_a_row=2)
    core.add_groups([f"k{i}" for i in range(4)])
    for _ in range(3):
        generate(core, 1)
        filter_first(core)
    why = core.filter_bound_passed()
    assert why is not None and "3 groups filtered in a row" in why
    assert "max_filtered_batches=2" in why
    generate(core, 1)
    for worker, role in (("lp", "logp"), ("ref", "ref_logp")):
        lease = grant(core.claim(role, worker, 1, 0.0))
        core.complete(lease.lease_id, lease.fence, list(lease.groups))
    assert core.state.filtered_in_a_row == 3  # scoring is no verdict
    lease = grant(core.claim("reward", "rw", 1, 0.0))
    core.complete(lease.lease_id, lease.fence, list(lease.groups), filtered=[None])
    assert core.state.filtered_in_a_row == 0 and core.filter_bound_passed() is None


def test_replay_and_snapshot_rebuild_the_filtered_state() -> None:
    core = make_core(train_batch_groups=1, max_staleness=2)
    core.add_groups(["a", "b"])
    generate(core, 2)
    grant(core.claim("logp", "lp", 100, 0.0))
    filter_first(core, which=1)  # the last judged: one filtered in a row
    records, _ = core.drain()
    replayed = SchedulerCore.restore(core.settings, [list(r) for r in records])
    assert dump_state(replayed.state) == dump_state(core.state)
    snap = dump_state(core.state)
    loaded = load_state(core.pipeline, {"gpu": 1}, snap)
    assert dump_state(loaded) == snap
    assert loaded.counts["filtered"] == 1 and loaded.filtered_in_a_row == 1
