"""Who is blamed when work ends badly: a group dies only when it is the likely cause.

The rule (runtime/scheduler/core/blame.py's docstring, the README's "What survives
what"): a worker's own failure of a group blames it; a worker's death blames a lone group,
or the suspects among several, and makes the rest suspects; suspects go to a worker one
at a time; leaving on purpose, a grant lost on its way, a dead payload holder and a
scheduler restart blame nobody.
"""

from __future__ import annotations

from asyncrl.runtime.scheduler.core import SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state, load_state
from asyncrl.runtime.scheduler.core.effects import Accepted

from .test_core import grant, make_core
from .test_core_lost_payloads import generated_with_refs


def blame(core: SchedulerCore) -> dict[int, tuple[str, dict[str, int], set[str]]]:
    return {gid: (g.state.value, g.attempts, g.suspects) for gid, g in core.state.groups.items()}


def test_a_worker_killed_holding_several_groups_costs_none_of_them_a_try() -> None:
    core = make_core(max_attempts=2)
    core.add_groups(["a", "b", "c"])
    grant(core.claim("generate", "gen", 3, now=0.0))
    assert core.register("gen", "generate", 1.0) == Accepted()  # killed, and back
    assert blame(core) == {gid: ("pending", {}, {"generate"}) for gid in range(3)}


def test_suspects_go_to_a_worker_one_at_a_time_beside_fresh_groups() -> None:
    core = make_core(max_attempts=2)
    core.add_groups(["a", "b", "c", "d"])
    grant(core.claim("generate", "gen", 2, now=0.0))  # a and b
    core.worker_lost("gen", "no heartbeat")
    core.register("gen", "generate", 1.0)
    core.loaded_version("gen", 0)
    first = grant(core.claim("generate", "gen", 4, now=1.0))
    assert first.groups == (0, 2, 3)  # one suspect, then the fresh ones; b waits
    assert core.claim("generate", "gen", 4, now=1.0) is None  # b waits for its own worker
    core.register("gen2", "generate", 1.0)
    core.loaded_version("gen2", 0)
    assert grant(core.claim("generate", "gen2", 4, now=1.0)).groups == (1,)


def test_a_poison_group_dies_and_the_groups_it_was_leased_with_live() -> None:
    core = make_core(max_attempts=2, train_batch_groups=4)
    core.add_groups(["ok1", "poison", "ok2", "ok3"])
    poison = 1
    deaths = 0
    for now in range(1, 20):
        lease = core.claim("generate", "gen", 4, now=float(now))
        if lease is None:
            break
        lease = grant(lease)
        if poison in lease.groups:  # the worker dies whenever it takes the poison group
            deaths += 1
            core.register("gen", "generate", float(now))
            core.loaded_version("gen", 0)
            continue
        n = len(lease.groups)
        core.complete(lease.lease_id, lease.fence, list(lease.groups), [(0, 0)] * n)
    states = {core.state.groups[g].key: core.state.groups[g].state.value for g in range(4)}
    assert states == {"ok1": "generated", "poison": "dead", "ok2": "generated", "ok3": "generated"}
    assert deaths == 3  # once among others (suspected), then alone twice (blamed twice)
    assert core.state.groups[poison].reason == "generate: worker registered again (attempt 2 of 2)"


def test_a_worker_killed_holding_one_group_blames_it() -> None:
    core = make_core(max_attempts=3)
    core.add_groups(["a", "b"])
    grant(core.claim("generate", "gen", 1, now=0.0))
    core.worker_lost("gen", "no heartbeat for 30s")
    assert blame(core) == {0: ("pending", {"generate": 1}, {"generate"}), 1: ("pending", {}, set())}


def test_a_suspect_that_completes_is_cleared() -> None:
    core = make_core(max_attempts=2)
    core.add_groups(["a", "b"])
    grant(core.claim("generate", "gen", 2, now=0.0))
    core.register("gen", "generate", 1.0)
    core.loaded_version("gen", 0)
    lease = grant(core.claim("generate", "gen", 1, now=1.0))
    core.complete(lease.lease_id, lease.fence, [0], [(0, 0)])
    assert blame(core)[0] == ("generated", {}, set())


def test_the_train_step_takes_its_batch_whole_and_blames_a_batch_of_suspects() -> None:
    core = make_core(max_attempts=2, train_batch_groups=2)
    generated_with_refs(core, ["a", "b"])
    for role, worker in (("logp", "lp"), ("ref_logp", "ref"), ("reward", "rw")):
        lease = grant(core.claim(role, worker, 2, now=0.0))
        core.complete(lease.lease_id, lease.fence, [0, 1])
    grant(core.claim("train", "tr", 2, now=0.0))
    core.register("tr", "train", 1.0)  # killed mid-step: both suspects, nobody blamed
    assert blame(core) == {gid: ("ready", {}, {"train"}) for gid in (0, 1)}
    step = grant(core.claim("train", "tr", 2, now=1.0))
    assert step.groups == (0, 1)  # a batch is a batch: suspects are not split up
    core.register("tr", "train", 2.0)  # killed again with the same batch: both blamed
    assert blame(core) == {gid: ("ready", {"train": 1}, {"train"}) for gid in (0, 1)}


def test_leaving_on_purpose_blames_nobody_and_suspects_nobody() -> None:
    core = make_core(max_attempts=1)
    core.add_groups(["a"])
    grant(core.claim("generate", "gen", 1, now=0.0))
    assert core.worker_lost("gen", "left: stopping", died=False) == Accepted()
    assert blame(core) == {0: ("pending", {}, set())}


def test_a_lease_its_live_worker_never_named_runs_out_unblamed() -> None:
    core = make_core(max_attempts=1, lease_timeout=10.0, worker_timeout=100.0)
    core.add_groups(["a"])
    lost = grant(core.claim("generate", "gen", 1, now=0.0))
    core.heartbeat("gen", 8.0, held=[])  # the grant never reached it
    assert core.tick(10.0) == 1
    assert lost.lease_id not in core.state.leases
    assert blame(core) == {0: ("pending", {}, set())}


def test_a_worker_silent_as_long_as_a_lease_lasts_died_with_all_it_held() -> None:
    core = make_core(max_attempts=2, lease_timeout=10.0, worker_timeout=100.0)
    core.add_groups(["a", "b"])
    grant(core.claim("generate", "gen", 1, now=0.0))
    grant(core.claim("generate", "gen", 1, now=5.0))  # expires later than the first
    assert core.tick(10.0) == 1
    assert core.state.leases == {}  # both went back at once: one death, two suspects
    assert blame(core) == {gid: ("pending", {}, {"generate"}) for gid in (0, 1)}


def test_a_payload_whose_holder_died_is_made_again_with_no_try_counted() -> None:
    core = make_core(max_attempts=1)
    generated_with_refs(core, ["a"])
    lease = grant(core.claim("reward", "rw", 1, 0.0))
    lost = [(0, "generate", "holder gone")]
    reply = core.fail(lease.lease_id, lease.fence, None, "fetch failed", lost, [(0, "generate")])
    assert reply == Accepted(1)
    assert blame(core) == {0: ("pending", {}, set())}
    assert core.state.regenerated == {"generate": 1}


def test_a_payload_that_cannot_be_read_from_a_live_holder_counts_a_try() -> None:
    core = make_core(max_attempts=1)
    generated_with_refs(core, ["a"])
    lease = grant(core.claim("reward", "rw", 1, 0.0))
    core.fail(lease.lease_id, lease.fence, None, "fetch failed", [(0, "generate", "corrupt")])
    assert core.state.groups[0].state == "dead"


def test_a_scheduler_restart_blames_nobody() -> None:
    core = make_core(max_attempts=1)
    core.add_groups(["a", "b"])
    lease = grant(core.claim("generate", "gen", 2, now=0.0))
    records, _ = core.drain()
    restarted = SchedulerCore.restore(core.settings, records)
    restarted.resume(now=50.0)  # down for longer than the lease lasted
    assert restarted.tick(55.0) == 0
    n = len(lease.groups)
    reply = restarted.complete(lease.lease_id, lease.fence, list(lease.groups), [(0, 0)] * n)
    assert reply == Accepted(2)
    assert blame(restarted) == {gid: ("generated", {}, set()) for gid in (0, 1)}


def test_suspects_survive_a_replay_and_a_snapshot() -> None:
    core = make_core(max_attempts=2)
    core.add_groups(["a", "b"])
    grant(core.claim("generate", "gen", 2, now=0.0))
    core.register("gen", "generate", 1.0)
    records, _ = core.drain()
    replayed = SchedulerCore.restore(core.settings, records)
    reloaded = load_state(core.pipeline, {"gpu": 1}, dump_state(core.state))
    assert blame(replayed) == blame(core)
    assert {g: x.suspects for g, x in reloaded.groups.items()} == {0: {"generate"}, 1: {"generate"}}
