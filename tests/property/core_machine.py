"""A hypothesis state machine that drives the real scheduler core against ``PipelineModel``.

Random interleavings of claims, completions, failures, stale completions, lease expiries,
worker deaths and restarts, lock requests, version publications and loads, train steps
and restarts from the journal. After every step the invariants compare core and model.
``make_machine`` takes the pipeline table as a parameter so a test can plant a wrong row
and show that this machine catches it.
"""

from __future__ import annotations

import random

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Pipeline
from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.codec import dump_state
from asyncrl.runtime.scheduler.core.effects import (
    Grant,
    LockGranted,
    LockQueued,
    Rejected,
    Transition,
)
from asyncrl.runtime.scheduler.core.status import summarize
from tests.support.core_indexes import index_mismatches

from .pipeline_model import (
    CRITIC,
    CRITIC_MAKES_VALUES_TABLE,
    CRITIC_TABLE,
    DEFAULT_TABLE,
    GENERATE,
    REWARD,
    TRAIN,
    VALUES,
    ModelLease,
    PipelineModel,
)

GENERATORS = ("gen0", "gen1")
WORKERS = {"gen0": GENERATE, "gen1": GENERATE, "logp0": "logp", "ref0": "ref_logp",
           "rew0": "reward", "train0": TRAIN}  # fmt: skip
# with a critic (Pipeline.with_critic): its values scorer and its step, each a worker
CRITIC_WORKERS = {**WORKERS, "val0": VALUES, "critic0": CRITIC}
# roles whose workers report the version they loaded (of the policy; values: of the critic)
LOADING = (GENERATE, VALUES)
LEASE_TIMEOUT, WORKER_TIMEOUT = 10.0, 25.0
GPU = "gpu"


def make_machine(
    pipeline: Pipeline = DEFAULT_PIPELINE, *, sync: bool = False, values_stage: bool | None = None
) -> type:
    """``values_stage``: whether the model has PPO's values branch; None: as ``pipeline``
    has (a planted table that lost the row is judged against the model that has it)."""
    critic = bool(pipeline.for_role(CRITIC))
    if values_stage is None:
        values_stage = bool(pipeline.for_role(VALUES))
    table = DEFAULT_TABLE
    workers = WORKERS
    if critic:
        table = CRITIC_TABLE if values_stage else CRITIC_MAKES_VALUES_TABLE
        workers = CRITIC_WORKERS if values_stage else {**WORKERS, "critic0": CRITIC}

    class CoreMachine(RuleBasedStateMachine):
        keys = Bundle("keys")
        roles = workers

        def __init__(self) -> None:
            super().__init__()
            self.now = 0.0
            self.journal: list = []
            self.snapshot: tuple[dict, int] | None = None  # (state, records before it)
            self.last_state: dict[int, str] = {}

        @initialize(
            staleness=st.just(0) if sync else st.integers(1, 3),
            batch=st.integers(1, 3),
            attempts=st.integers(1, 3),
            capacity=st.integers(1, 2),
            fence_key=st.sampled_from([b"", b"run secret"]),
        )
        def setup(
            self, staleness: int, batch: int, attempts: int, capacity: int, fence_key: bytes
        ) -> None:
            self.settings = CoreSettings(staleness, batch, attempts, LEASE_TIMEOUT,
                                         WORKER_TIMEOUT, {GPU: capacity}, fence_key)  # fmt: skip
            self.core = SchedulerCore(self.settings, pipeline)
            self.model = PipelineModel(
                staleness, batch, attempts, LEASE_TIMEOUT, WORKER_TIMEOUT, table=table
            )
            for worker in workers:
                self._register(worker)
                if workers[worker] in LOADING:
                    self._ok(self.core.loaded_version(worker, 0))
                    self.model.loaded[worker] = 0
            self.seen = (0, 0, dict(self.model.loaded))
            self.add_groups(4 * batch)

        # --- helpers -----------------------------------------------------------------

        def _sync_journal(self) -> None:
            records, notices = self.core.drain()
            self.journal.extend(records)
            for notice in notices:
                if isinstance(notice, Transition):
                    self._follow(notice)

        def _follow(self, move: Transition) -> None:
            """Every move the core announces is an edge of the pipeline, from where it was."""
            edge = (move.source.value, move.target.value)
            assert edge in table.edges, f"groups {move.groups} moved {edge[0]}→{edge[1]}"
            for gid in move.groups:
                was = self.last_state.get(gid, "pending")
                assert was == move.source, f"group {gid} left {move.source} but was in {was}"
                self.last_state[gid] = move.target.value

        def _ok(self, reply: object) -> None:
            assert not isinstance(reply, Rejected), reply
            self._sync_journal()

        def _register(self, worker: str) -> None:
            self._ok(self.core.register(worker, workers[worker], self.now))
            if worker in self.model.workers:
                self.model.died(worker)  # a new process: the old one died holding its work
            self.model.workers[worker] = workers[worker]
            self.model.last_seen[worker] = self.now
            if workers[worker] in LOADING:
                self.model.loaded[worker] = None

        def _unchanged(self, action) -> None:
            before = dump_state(self.core.state)
            reply = action()
            assert isinstance(reply, Rejected), f"expected a refusal, got {reply}"
            assert dump_state(self.core.state) == before
            records, _ = self.core.drain()
            assert records == []

        # --- data ----------------------------------------------------------------------

        @rule(target=keys, count=st.integers(1, 4))
        def add_groups(self, count: int) -> str:
            first = self.core.state.next_gid
            names = [f"prompt-{first + i}" for i in range(count)]
            self._ok(self.core.add_groups(names))
            self.model.add(first, count)
            return names[0]

        @rule(key=keys)
        def add_duplicate(self, key: str) -> None:
            self._unchanged(lambda: self.core.add_groups([key]))

        # --- leases --------------------------------------------------------------------

        @rule(worker=st.sampled_from(sorted(workers)), n=st.integers(1, 5), lock=st.booleans())
        def claim(self, worker: str, n: int, lock: bool) -> None:
            role = workers[worker]
            if worker not in self.model.workers:
                return self._unchanged(lambda: self.core.claim(role, worker, n, self.now))
            if role in LOADING and self.model.loaded[worker] is None:
                return self._unchanged(lambda: self.core.claim(role, worker, n, self.now))
            reply = self.core.claim(role, worker, n, self.now)
            self._ok(reply)
            if role == CRITIC:
                self.model.redo_stale_values()
            if reply is None:
                return self._check_idle(role, worker)
            assert isinstance(reply, Grant)
            self._check_grant(role, worker, n, reply)
            if lock:
                self._ok(self.core.acquire(GPU, reply.lease_id, reply.fence))

        def _check_idle(self, role: str, worker: str) -> None:
            if role in (GENERATE, TRAIN, CRITIC):
                return
            if role == VALUES and self.model.loaded[worker] < self.model.oldest_critic_allowed():
                return  # its values would be too stale for the next critic step
            takeable = self.model.takeable_for(role, worker, 1)
            assert takeable == [], f"{role} had work but got none"

        def _check_grant(self, role: str, worker: str, n: int, grant: Grant) -> None:
            gids = list(grant.groups)
            if role not in (GENERATE, TRAIN, CRITIC):
                oldest = self.model.takeable_for(role, worker, n)
                assert gids == oldest, f"{role} got {gids}, oldest takeable {oldest}"
            if role == TRAIN:
                assert len(gids) == self.model.batch, f"train batch of {len(gids)}"
                assert not self.model.train_leased(), "two train steps at once"
                # Which ready groups a batch takes is not asserted: suspects waiting to go
                # alone and payloads made again change the order of admission, and the
                # promise that matters, every group trained within the staleness bound, is
                # checked by the invariants after every step.
            elif role == CRITIC:
                assert 1 <= len(gids) <= self.model.batch, f"critic batch of {len(gids)}"
                assert not self.model.leased(CRITIC), "two critic steps at once"
                # less than a batch only for a train step that waits for them
                assert len(gids) == self.model.batch or not self.model.train_leased()
                assert grant.version == self.model.critic_steps_done
            else:
                assert 1 <= len(gids) <= n
            if role in LOADING:
                assert grant.version == self.model.loaded[worker]
            lease = ModelLease(grant.lease_id, grant.fence, role, worker, grant.expires_at,
                               set(gids), grant.version)  # fmt: skip
            assert grant.expires_at == self.now + LEASE_TIMEOUT
            self.model.lease(lease)
            if role not in (TRAIN, CRITIC):  # so that its next death names the suspect it held
                held = self.model.suspects_held(worker, role)
                assert held <= 1, f"{worker} holds {held} suspects"

        def _pick_lease(self, data: st.DataObject) -> ModelLease:
            lids = sorted(self.model.leases)
            return self.model.leases[data.draw(st.sampled_from(lids))]

        def _pick_groups(self, data: st.DataObject, lease: ModelLease) -> list[int]:
            gids = sorted(lease.gids)
            if lease.role in (TRAIN, CRITIC):
                return gids
            chosen = data.draw(st.lists(st.sampled_from(gids), min_size=1, unique=True))
            return sorted(chosen)

        @rule(data=st.data())
        def busy_round(self, data: st.DataObject) -> None:
            """Every role claims, maybe locks, maybe completes: deep states in few steps."""
            # a seeded Random, not st.randoms(): every call of that would use up test data
            rng = random.Random(data.draw(st.integers(0, 2**32)))
            for _ in range(data.draw(st.integers(1, 4))):
                self.now += 0.5
                _one_round(self, rng)

        @precondition(lambda self: self.model.leases)
        @rule(data=st.data())
        def complete(self, data: st.DataObject) -> None:
            lease = self._pick_lease(data)
            gids = self._pick_groups(data, lease)
            behaviour = durable = None
            if lease.role == GENERATE:
                behaviour = [self._draw_versions(data, lease.version) for _ in gids]
            if lease.role == TRAIN:  # a checkpoint now and then
                upto = self.model.steps_done + 1
                durable = data.draw(st.one_of(st.none(), st.integers(0, upto)))
            verdicts = None
            if lease.role == REWARD:  # dynamic sampling: some groups carry no signal
                flags = data.draw(st.lists(st.booleans(), min_size=len(gids), max_size=len(gids)))
                verdicts = [("no signal" if flag else None) for flag in flags]
            filtered = (
                frozenset()
                if verdicts is None
                else frozenset(g for g, why in zip(gids, verdicts, strict=True) if why)
            )
            # a result for a group a sibling filtered while this lease held it: ignored
            late = sorted(lease.dropped)
            if late and data.draw(st.booleans()) and lease.role not in (TRAIN, CRITIC):
                gids = sorted(gids + late)
                if verdicts is not None:
                    verdicts = [None if g in late else ("no signal" if g in filtered else None)
                                for g in gids]  # fmt: skip
            reply = self.core.complete(
                lease.lid, lease.fence, gids, behaviour, None, durable, verdicts
            )
            self._ok(reply)
            self.model.complete(lease.lid, gids, behaviour, filtered)
            if lease.role == TRAIN:
                self._check_step(gids)
                self.model.durable_step = max(self.model.durable_step, durable or 0)
            if lease.role == CRITIC:
                self._check_critic_step(gids)

        def _draw_versions(self, data: st.DataObject, floor: int) -> tuple[int, int]:
            top = self.model.policy_version
            low = data.draw(st.one_of(st.just(floor), st.integers(floor, top)))
            return low, data.draw(st.integers(low, top))

        def _check_critic_step(self, gids: list[int]) -> None:
            step, bound = self.model.critic_steps_done, self.model.max_staleness
            for gid in gids:
                made = self.model.groups[gid].critic_version
                if made is None:  # no values stage: the step made them, at its version
                    assert not values_stage, f"group {gid}: no values at step {step}"
                    continue
                assert step - 1 - made <= bound, f"group {gid}: values of v{made} at step {step}"

        def _check_step(self, gids: list[int]) -> None:
            step, bound = self.model.steps_done, self.model.max_staleness
            for gid in gids:
                if critic:
                    assert self.model.groups[gid].critic_step is not None, f"{gid}: no critic"
                low, high = self.model.groups[gid].behaviour
                assert step - 1 - low <= bound, f"group {gid} of v{low} trained at step {step}"
                if sync:
                    assert low == high == step - 1, f"off-policy group {gid} in sync mode"

        @precondition(lambda self: self.model.leases)
        @rule(data=st.data(), reason=st.sampled_from(["oom", "reward raised", "nan loss"]))
        def fail(self, data: st.DataObject, reason: str) -> None:
            lease = self._pick_lease(data)
            gids = self._pick_groups(data, lease)
            self._ok(self.core.fail(lease.lid, lease.fence, gids, reason))
            self.model.fail(lease.lid, gids)

        @precondition(lambda self: any(x.role != GENERATE for x in self.model.leases.values()))
        @rule(data=st.data())
        def payload_lost(self, data: st.DataObject) -> None:
            """A reader cannot fetch a payload: its holder died, or the bytes are corrupt."""
            readers = [x for x in self.model.leases.values() if x.role != GENERATE]
            lease = data.draw(st.sampled_from(sorted(readers, key=lambda x: x.lid)))
            gid = data.draw(st.sampled_from(sorted(lease.gids)))
            made_by = sorted(table.reads[lease.role])
            role = data.draw(st.sampled_from(made_by))
            lost = [(gid, role, "holder gone")]
            gone = data.draw(st.booleans())  # its holder died, or the bytes are bad
            holder_gone = [(gid, role)] if gone else []
            reply = self.core.fail(lease.lid, lease.fence, None, "fetch failed", lost, holder_gone)
            self._ok(reply)
            self.model.payload_lost(lease.lid, gid, role, counted=not gone)

        @precondition(lambda self: self.model.ended or self.model.leases)
        @rule(data=st.data())
        def stale_completion(self, data: st.DataObject) -> None:
            past = [(lid, fence) for lid, fence in self.model.ended]
            live = [(x.lid, x.fence - 1) for x in self.model.leases.values()]
            if self.settings.fence_key:  # unkeyed, a fence is a count: guessable on purpose
                # Guesses from what a client sees: the lease id, the fences it was given.
                live += [(x.lid, x.lid) for x in self.model.leases.values()]
                live += [(x.lid, f) for x in self.model.leases.values() for _, f in past]
            lid, fence = data.draw(st.sampled_from(past + live))
            gid = next(iter(self.model.groups), 0)
            self._unchanged(lambda: self.core.complete(lid, fence, [gid], None))
            self._unchanged(lambda: self.core.fail(lid, fence, None, "late"))
            self._unchanged(lambda: self.core.acquire(GPU, lid, fence))

        # --- time and workers ----------------------------------------------------------

        @rule(dt=st.sampled_from([0.5, 2.0, 6.0, 11.0]))
        def advance(self, dt: float) -> None:
            self.now += dt
            self.core.tick(self.now)
            self._sync_journal()
            self.model.tick(self.now)

        @rule(worker=st.sampled_from(sorted(workers)))
        def heartbeat(self, worker: str) -> None:
            if worker not in self.model.workers:
                return self._unchanged(lambda: self.core.heartbeat(worker, self.now))
            self._ok(self.core.heartbeat(worker, self.now))
            self.model.heartbeat(worker, self.now)

        @rule(worker=st.sampled_from(sorted(workers)))
        def worker_dies(self, worker: str) -> None:
            if worker not in self.model.workers:
                return
            self._ok(self.core.worker_lost(worker, "killed"))
            self.model.lose(worker)

        @rule(worker=st.sampled_from(sorted(workers)))
        def worker_leaves(self, worker: str) -> None:
            """A Bye: it leaves on purpose, and what it held goes back unblamed."""
            if worker not in self.model.workers:
                return
            self._ok(self.core.worker_lost(worker, "left: stopping", died=False))
            self.model.lose(worker, died=False)

        @rule(worker=st.sampled_from(sorted(workers)))
        def worker_restarts(self, worker: str) -> None:
            self._register(worker)

        # --- versions ------------------------------------------------------------------

        @precondition(lambda self: self.model.steps_done > self.model.policy_version)
        @rule(data=st.data())
        def publish(self, data: st.DataObject) -> None:
            version = data.draw(st.integers(self.model.policy_version + 1, self.model.steps_done))
            if "train0" not in self.model.workers:
                return self._unchanged(lambda: self.core.publish_version("train0", version))
            self._ok(self.core.publish_version("train0", version))
            self.model.policy_version = version

        @precondition(lambda self: self.model.critic_steps_done > self.model.critic_version)
        @rule(data=st.data())
        def publish_critic(self, data: st.DataObject) -> None:
            model = self.model
            version = data.draw(st.integers(model.critic_version + 1, model.critic_steps_done))
            if "critic0" not in model.workers:
                return self._unchanged(lambda: self.core.publish_version("critic0", version))
            self._ok(self.core.publish_version("critic0", version))
            model.critic_version = version

        @precondition(lambda self: critic)
        @rule(data=st.data())
        def load_critic(self, data: st.DataObject) -> None:
            if "val0" not in self.model.workers:
                return
            floor = self.model.loaded["val0"] or 0
            version = data.draw(st.integers(floor, self.model.critic_version + 1))
            if version > self.model.critic_version:
                return self._unchanged(lambda: self.core.loaded_version("val0", version))
            self._ok(self.core.loaded_version("val0", version))
            self.model.loaded["val0"] = version

        @precondition(lambda self: self.model.steps_done > 0)
        @rule(data=st.data())
        def trainer_rolls_back(self, data: st.DataObject) -> None:
            """The trainer's host was lost: its state survived only as of an older step."""
            step = data.draw(st.integers(0, self.model.steps_done - 1))
            if "train0" not in self.model.workers or step < self.model.durable_step:
                return self._unchanged(lambda: self.core.rewind("train0", step))
            self._ok(self.core.rewind("train0", step))
            event("rolled back", self.model.roll_back(step) > 0)
            state = self.core.state
            loaded = {w: i.loaded for w, i in state.workers.items()}
            self.seen = (state.steps_done, state.policy_version, loaded)  # went back on purpose

        @precondition(lambda self: critic and self.model.critic_steps_done > 0)
        @rule(data=st.data())
        def critic_rolls_back(self, data: st.DataObject) -> None:
            """The critic's host was lost: its state survived only as of an older step."""
            step = data.draw(st.integers(0, self.model.critic_steps_done - 1))
            if "critic0" not in self.model.workers:
                return self._unchanged(lambda: self.core.rewind("critic0", step))
            self._ok(self.core.rewind("critic0", step))
            event("values made again", self.model.roll_back_critic(step) > 0)
            state = self.core.state
            loaded = {w: i.loaded for w, i in state.workers.items()}
            self.seen = (state.steps_done, state.policy_version, loaded)

        @rule(worker=st.sampled_from(GENERATORS), data=st.data())
        def load(self, worker: str, data: st.DataObject) -> None:
            if worker not in self.model.workers:
                return
            floor = self.model.loaded[worker] or 0
            version = data.draw(st.integers(floor, self.model.policy_version + 1))
            if version > self.model.policy_version:
                return self._unchanged(lambda: self.core.loaded_version(worker, version))
            self._ok(self.core.loaded_version(worker, version))
            self.model.loaded[worker] = version

        # --- locks ---------------------------------------------------------------------

        @precondition(lambda self: self.model.leases)
        @rule(data=st.data())
        def acquire(self, data: st.DataObject) -> None:
            lease = self._pick_lease(data)
            reply = self.core.acquire(GPU, lease.lid, lease.fence)
            self._sync_journal()
            assert isinstance(reply, LockGranted | LockQueued | Rejected)

        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            holders = sorted(self.core.state.resources[GPU].holders)
            stale = data.draw(st.integers(0, self.core.state.fence + 1))
            if stale not in holders:
                self._unchanged(lambda: self.core.release(GPU, stale))
            if holders:
                self._ok(self.core.release(GPU, data.draw(st.sampled_from(holders))))

        # --- restart from the journal --------------------------------------------------

        @rule()
        def take_snapshot(self) -> None:
            self.snapshot = (dump_state(self.core.state), len(self.journal))

        @rule()
        def restart(self) -> None:
            """The scheduler crashes and comes back from its journal."""
            replayed = self._replayed()
            assert dump_state(replayed.state) == dump_state(self.core.state)
            self.core = replayed
            self.core.resume(self.now)  # workers could not heartbeat while it was down
            self._sync_journal()
            for worker in self.model.workers:
                self.model.heartbeat(worker, self.now)

        def _replayed(self, use_snapshot: bool = True) -> SchedulerCore:
            if use_snapshot and self.snapshot is not None:
                state, upto = self.snapshot
                return SchedulerCore.restore(self.settings, self.journal[upto:], pipeline, state)
            return SchedulerCore.restore(self.settings, self.journal, pipeline)

        # --- invariants ----------------------------------------------------------------

        @invariant()
        def groups_match_the_model(self) -> None:
            for gid, expected in self.model.groups.items():
                if expected.state in ("trained", "superseded", "filtered"):
                    assert gid not in self.core.state.groups, f"trained {gid} kept in the table"
                    continue
                group = self.core.state.groups[gid]
                assert group.state == expected.state, f"group {gid}: {group.state} != model"
                assert self.last_state.get(gid, "pending") == group.state, f"{gid} moved unseen"
                assert group.done == expected.done, f"group {gid}: branches {group.done}"
                assert set(group.leases) == expected.leased, f"group {gid}: leases"
                if expected.state != "dead":  # who is blamed for what, as the rule says
                    assert group.attempts == expected.attempts, f"group {gid}: attempts"
                    assert group.suspects == expected.suspects, f"group {gid}: suspects"

        @invariant()
        def filtered_groups_are_never_trained(self) -> None:
            """Every group is trained, filtered or dead at most once, and a filtered one
            never reaches a batch; the bound on filtering in a row counts as the model."""
            filtered = {g for g, m in self.model.groups.items() if m.state == "filtered"}
            trained = {gid for batch in self.model.batches for gid in batch}
            assert not filtered & trained, f"filtered groups trained: {filtered & trained}"
            assert self.core.state.filtered_in_a_row == self.model.filtered_in_a_row
            for lease in self.core.state.leases.values():
                assert not lease.gids & filtered, f"lease {lease.lid} holds filtered groups"

        @invariant()
        def groups_are_conserved(self) -> None:
            """Every group made is in exactly one state: created = trained + superseded +
            filtered + dead + in flight, in the core's counts and in what status reports."""
            counts = self.core.state.counts
            assert all(n >= 0 for n in counts.values()), counts
            assert sum(counts.values()) == len(self.model.groups) == self.core.state.next_gid
            for final in ("trained", "superseded", "filtered", "dead"):
                expected = sum(1 for g in self.model.groups.values() if g.state == final)
                assert counts[final] == expected, f"{final}: {counts[final]} != {expected}"
            summary = summarize(self.core.state)
            assert sum(summary["groups"].values()) == summary["created"], summary["groups"]
            batches = [gid for batch in self.model.batches for gid in batch]
            assert counts["trained"] == len(batches) == len(set(batches))
            assert self.core.state.critic_steps_done == len(self.model.critic_batches)

        @invariant()
        def trained_groups_are_fresh_enough(self) -> None:
            assert self.core.state.worst_staleness <= self.model.max_staleness
            assert self.core.state.worst_critic_staleness <= self.model.max_staleness
            assert self.model.overdue() == [], "a started group can no longer be trained in time"

        @invariant()
        def versions_only_go_forward(self) -> None:
            state = self.core.state
            steps, policy, loaded = self.seen
            assert state.steps_done >= steps and state.policy_version >= policy
            assert state.policy_version <= state.steps_done
            assert state.critic_version <= state.critic_steps_done
            for worker, info in state.workers.items():
                if info.loaded is not None and loaded.get(worker) is not None:
                    assert info.loaded >= loaded[worker], f"{worker} loaded went back"
            current = {w: i.loaded for w, i in state.workers.items()}
            self.seen = (state.steps_done, state.policy_version, current)

        @invariant()
        def locks_respect_capacity(self) -> None:
            resource = self.core.state.resources[GPU]
            assert len(resource.holders) <= resource.capacity
            state = self.core.state
            for token, lid in resource.holders.items():
                assert lid in state.leases, f"lock {token} held by ended lease {lid}"
                if not self.settings.fence_key:
                    assert token <= state.fence
            # Lease fences and lock tokens come from one keyed count: never two alike.
            tokens = [x.fence for x in state.leases.values()] + list(resource.holders)
            assert len(set(tokens)) == len(tokens), "a fence issued twice"
            for lid in resource.waiting:
                assert lid in self.core.state.leases
            if resource.waiting:
                assert len(resource.holders) == resource.capacity, "a waiter left behind"

        @invariant()
        def indexes_match_a_scan(self) -> None:
            assert index_mismatches(self.core, self.now) == []

        @invariant()
        def replay_equals_live(self) -> None:
            self._sync_journal()
            live = dump_state(self.core.state)
            replayed = self._replayed(use_snapshot=False)
            assert dump_state(replayed.state) == live
            assert index_mismatches(replayed, self.now) == []
            if self.snapshot is not None:
                replayed = self._replayed()
                assert dump_state(replayed.state) == live
                assert index_mismatches(replayed, self.now) == []

        def teardown(self) -> None:
            if hasattr(self, "core"):
                drain_to_the_end(self)

    return CoreMachine


def drain_to_the_end(machine: RuleBasedStateMachine) -> None:
    """Liveness: with every worker healthy, the pipeline trains everything it can."""
    core, model = machine.core, machine.model
    for worker in machine.roles:
        if worker not in model.workers:
            machine._register(worker)
    for lease in list(model.leases.values()):
        if lease.lid in model.leases:
            machine._ok(core.fail(lease.lid, lease.fence, None, "drained"))
            model.fail(lease.lid, sorted(lease.gids))
    for _ in range(2 * len(model.groups) + 50):  # a step a round at worst (batch 1)
        machine.now += 1.0
        progressed = _one_round(machine, None)
        if not progressed and not model.leases:
            break
    # what no step can take: fewer than a batch, ready or through the critic's step
    waiting = ("ready", "critic_trained")
    left = [g for g in model.alive_untrained() if model.groups[g].state not in waiting]
    stuck = {g: (core.state.groups[g].state.value, core.state.groups[g].train_by) for g in left}
    assert not left, f"groups stuck short of ready: {stuck}; {_pipeline_view(core)}"
    assert len(model.alive_untrained()) < model.batch, "a full batch was never trained"
    assert core.state.leases == {}


def _pipeline_view(core: SchedulerCore) -> str:
    s = core.state
    loaded = {w: i.loaded for w, i in s.workers.items() if i.role in LOADING}
    steps = f"step {s.steps_done}, critic step {s.critic_steps_done}"
    return f"{steps}, due {dict(s.due)}, ready {dict(s.due_ready)}, loaded {loaded}"


def _one_round(machine: RuleBasedStateMachine, rng: random.Random | None) -> bool:
    """Heartbeat, claim and complete for every worker; with ``rng``, lock and leave some."""
    core, model = machine.core, machine.model
    progressed = False
    if model.steps_done > model.policy_version and "train0" in model.workers:
        machine._ok(core.publish_version("train0", model.steps_done))  # a step left unpublished
        model.policy_version = model.steps_done
    if model.critic_steps_done > model.critic_version and "critic0" in model.workers:
        machine._ok(core.publish_version("critic0", model.critic_steps_done))
        model.critic_version = model.critic_steps_done
    for worker in GENERATORS:
        if worker in model.workers and model.loaded[worker] != model.policy_version:
            machine._ok(core.loaded_version(worker, model.policy_version))
            model.loaded[worker] = model.policy_version
    if "val0" in model.workers and model.loaded["val0"] != model.critic_version:
        machine._ok(core.loaded_version("val0", model.critic_version))
        model.loaded["val0"] = model.critic_version
    for worker, role in machine.roles.items():
        if worker not in model.workers:
            continue
        machine._ok(core.heartbeat(worker, machine.now))
        model.heartbeat(worker, machine.now)
        redone = core.state.regenerated[VALUES]
        reply = core.claim(role, worker, 8, machine.now)
        machine._ok(reply)
        if role == CRITIC:
            model.redo_stale_values()
            # values made again are work for the next round
            progressed |= core.state.regenerated[VALUES] > redone
        if reply is None:
            continue
        machine._check_grant(role, worker, 8, reply)
        progressed = True
        if rng is not None and rng.random() < 0.5:
            machine._ok(core.acquire(GPU, reply.lease_id, reply.fence))
        if rng is not None and rng.random() < 0.3:
            continue  # left running: leases pile up, locks contend, deadlines pass
        gids = list(reply.groups)
        version = reply.version
        behaviour = [(version, version)] * len(gids) if role == GENERATE else None
        filtered: frozenset[int] = frozenset()
        if role == REWARD and rng is not None:  # some groups carry no signal
            filtered = frozenset(g for g in gids if rng.random() < 0.3)
        verdicts = [("all alike" if g in filtered else None) for g in gids] if filtered else None
        reply_ = core.complete(reply.lease_id, reply.fence, gids, behaviour, None, None, verdicts)
        machine._ok(reply_)
        model.complete(reply.lease_id, gids, behaviour, filtered)
        if role == TRAIN:
            machine._check_step(gids)
            machine._ok(core.publish_version(worker, model.steps_done))
            model.policy_version = model.steps_done
        if role == CRITIC:
            machine._check_critic_step(gids)
    return progressed
