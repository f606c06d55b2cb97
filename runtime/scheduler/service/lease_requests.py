"""The work path: Claim → Lease (or the entry role's Want → AddGroups), then Complete or
Fail; Held (which kept payloads to free), Lock and Unlock under a lease.

A Complete may carry the worker's next claim (``claim_next``): once its results are taken
it is answered like a Claim (the same handler, the same waiting queue), the Lease in place
of the Ack when there is work (:func:`claim_along`; a LoadedVersion may carry one too).
A busy worker then makes one request per lease, not two.
A train step's Complete is answered StepDone whatever it asks: the trainer publishes the
version the reply names before it claims again.

A Complete that finishes a train step writes the step's metrics line (what each role's
time went to, activity.py; the step's critical path, step_path.py; the newest reports,
reports.py: step_lines.py) and, after the last step, starts the drain. The handlers are
:class:`LeaseRequests`'s methods, given what they read and change (service.py builds it
and says which handler answers which message).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import structlog

from asyncrl.runtime.contract.bus import ACTIVITY_KEY
from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import FINAL_STATES, Gate, GroupState
from asyncrl.runtime.scheduler.core.effects import (
    Accepted,
    Grant,
    LockGranted,
    LockQueued,
    Rejected,
)
from asyncrl.runtime.scheduler.core.entities import Group, Lease
from asyncrl.runtime.scheduler.core.scheduler import SchedulerCore
from asyncrl.transport import protocol as p

from .activity import RoleActivity
from .payload_refs import PayloadStores, holder_of, lease_item, store_of, stored
from .replies import error_of, reply_of
from .run_progress import RunProgress
from .step_lines import StepLines
from .step_path import StepPath
from .trace import Trace
from .waiting import WaitingWorkers

__all__ = ["MAX_CLAIM", "LeaseRequests", "bad_claim_next"]

log = structlog.get_logger("asyncrl.scheduler")

# Leases a claim may find ended at once, every group of each reading a gone holder's
# payload, before it answers NoWork (the groups are made again meanwhile).
_CLAIMS_PAST_GONE_HOLDERS = 3

MAX_CLAIM = 65_536
"""The most groups a claim sent with a completion may ask for: more than any worker holds
at once, so a larger number is a bug in the sender (an unset or wrapped counter)."""


def bad_claim_next(count: int) -> p.Error | None:
    """The refusal of a request whose carried claim (``claim_next``) is out of range: it is
    refused whole, nothing taken and nothing leased."""
    if 0 <= count <= MAX_CLAIM:
        return None
    detail = f"claim_next {count} is not a number of groups from 0 to {MAX_CLAIM}"
    return p.Error(Reason.BAD_REQUEST, detail)


class LeaseRequests:
    """Claim, Complete, Fail, Held, Lock, Unlock and AddGroups, given the core, the run's
    progress, the waiting workers, the payload stores, and what a lease or a step's
    completion is noted in."""

    def __init__(
        self,
        core: SchedulerCore,
        progress: RunProgress,
        waiting: WaitingWorkers,
        payloads: PayloadStores,
        path: StepPath,
        activity: RoleActivity,
        trace: Trace,
        step_lines: StepLines,
        awaits_final_validation: Callable[[], bool] = lambda: False,
        validation_needs: frozenset[str] = frozenset(),
    ) -> None:
        """``validation_needs``: the roles besides the trainer that the last version's
        validation needs while it runs (a harness's validates through the generators)."""
        self.core = core
        self.progress = progress
        self.waiting = waiting
        self.payloads = payloads
        self.path = path
        self.activity = activity
        self.trace = trace
        self.step_lines = step_lines
        self.step_role = core.pipeline.gated(Gate.STEP).role
        self.awaits_final_validation = awaits_final_validation
        self.kept_for_validation = validation_needs | {self.step_role}

    def claim(self, m: p.Claim, now: float) -> p.Message:
        reply = self._claim(m, now)
        if isinstance(reply, p.NoWork) or (isinstance(reply, p.Want) and not reply.count):
            self.waiting.found_nothing(m.role, m.worker)  # the next work for m.role wakes it
        else:
            self.waiting.claimed(m.worker)
        return reply

    def _claim(self, m: p.Claim, now: float) -> p.Message:
        if self.progress.draining is not None:
            # The trainer holds the last version's weights: it stays while the run's
            # validation of that version may still need to fetch them; so do the
            # generators a harness validates through.
            if m.role in self.kept_for_validation and self.awaits_final_validation():
                return p.NoWork("the last version is being validated")
            return p.Shutdown(self.progress.draining)
        if m.role == self.core.pipeline.entry_role:
            return self._want(m)
        for _ in range(_CLAIMS_PAST_GONE_HOLDERS):
            grant = self.core.claim(m.role, m.worker, m.n, now)
            if grant is None:
                return p.NoWork("nothing to do now")
            if isinstance(grant, Rejected):
                return error_of(grant)
            grant = self._without_gone_holders(grant)
            if grant is not None:
                break
        else:
            return p.NoWork("the work found read payloads whose holders are gone: made again")
        if grant.role == self.step_role:
            self.path.leased(grant.lease_id, now)
        self.trace.granted(grant, m.worker, now)
        return self._lease(grant, now)

    def _want(self, m: p.Claim) -> p.Message:
        refused = self._not_the_entry_role(m.worker)
        if refused is not None:
            return refused
        counts = self.core.state.counts
        alive = sum(counts[s] for s in GroupState if s not in FINAL_STATES)
        needed = self.progress.plan.total_groups - counts[GroupState.TRAINED] - alive
        entry = self.core.pipeline.entry
        # Suspects wait for a worker free of suspects (core/blame.py); fresh prompts keep the
        # workers busy meanwhile, so they do not count against the backlog.
        waiting = counts[entry] - self.core.state.indexes.suspected[entry]
        room = self.progress.plan.backlog - waiting
        return p.Want(max(0, min(m.n, needed, room)))

    def _not_the_entry_role(self, worker: str) -> p.Error | None:
        known = self.core.state.workers.get(worker)
        if known is None:  # its own code, so the worker knows to register again
            return p.Error(Reason.UNKNOWN_WORKER, f"worker {worker!r} is not registered")
        if known.role != self.core.pipeline.entry_role:
            return p.Error(Reason.WRONG_ROLE, f"{worker!r} is registered as {known.role}")
        return None

    def _without_gone_holders(self, grant: Grant) -> Grant | None:
        """``grant`` less the groups whose payloads it would read from a process known to be
        gone; those are made again at once, uncounted, as when a reader reports them lost
        (SchedulerCore.fail), rather than after the reader has waited out its fetch timeout.
        None if no group is left (the lease has ended)."""
        state, pipeline = self.core.state, self.core.pipeline
        stage = pipeline.stage_at(state.leases[grant.lease_id].source, grant.role)
        reads = pipeline.reads(stage)
        gone = [
            (gid, role)
            for gid in grant.groups
            for role, kept in state.groups[gid].data.items()
            if role in reads and self._known_gone(kept)
        ]
        if not gone:
            return grant
        lost = [(gid, role, f"its holder {holder_of(state.groups[gid].data[role])} is gone")
                for gid, role in gone]  # fmt: skip
        # A step takes its whole batch or nothing: the rest of its batch goes back uncounted.
        gids = sorted(grant.groups if stage.gate.batched else {gid for gid, _ in gone})
        reply = self.core.fail(grant.lease_id, grant.fence, gids, "holder gone", lost, gone)
        assert isinstance(reply, Accepted), reply  # the lease was granted this very turn
        log.info("payloads of gone holders made again before leasing", groups=gids[:8],
                 lease=grant.lease_id)  # fmt: skip
        lease = state.leases.get(grant.lease_id)
        if lease is None:
            return None
        return replace(grant, groups=tuple(g for g in grant.groups if g in lease.gids))

    def _known_gone(self, kept: object) -> bool:
        """Whether the process keeping ``kept`` is known to be gone: its worker is no longer
        registered, or has since reported another store (a new process). Not having heard of
        its store (since this scheduler started) is not knowing: its reader finds out."""
        holder = holder_of(kept)
        if holder is None:
            return False
        if holder not in self.core.state.workers:
            return True
        store = self.payloads.live.get(holder)
        return store is not None and store != store_of(kept)

    def _lease(self, grant: Grant, now: float) -> p.Lease:
        """The lease's groups with the payloads its stage reads, and no others."""
        state, pipeline = self.core.state, self.core.pipeline
        reads = pipeline.reads(pipeline.stage_at(state.leases[grant.lease_id].source, grant.role))
        items = tuple(
            lease_item(g, state.groups[g].key, state.groups[g].data, reads) for g in grant.groups
        )
        return p.Lease(
            grant.lease_id, grant.fence, grant.role, grant.expires_at - now, grant.version, items
        )

    def complete(self, m: p.Complete, now: float) -> p.Message:
        refused = bad_claim_next(m.claim_next)
        if refused is not None:
            return refused
        lease = self.core.state.leases.get(m.lease_id)
        taken = self._complete(m, lease, now)
        if not m.claim_next or lease is None or not isinstance(taken, p.Ack):
            return taken
        return self.claim_along(m.worker, lease.role, m.claim_next, taken, now)

    def claim_along(
        self, worker: str, role: str, count: int, taken: p.Ack, now: float
    ) -> p.Message:
        """The next lease of a claim carried by a request that was taken (``taken``, its
        reply), or ``taken`` when there is none: the worker then waits to be woken (claim put
        it in the queue), as after a claim that found nothing."""
        reply = self.claim(p.Claim(worker, role, count), now)
        if isinstance(reply, p.Lease):
            return reply
        if isinstance(reply, p.Error):  # what carried the claim is taken all the same: say so
            log.warning("claim carried by a request refused", worker=worker, code=reply.code,
                        detail=reply.detail)  # fmt: skip
        return taken

    def _complete(self, m: p.Complete, lease: Lease | None, now: float) -> p.Message:
        gids = [r.gid for r in m.results]
        versions = [r.behaviour for r in m.results]
        behaviour = None if all(v is None for v in versions) else versions
        if behaviour is not None and any(v is None for v in behaviour):
            return p.Error(Reason.BAD_RESULT, "either every result carries versions or none")
        holder = lease.worker if lease is not None else m.worker
        foreign = [r.gid for r in m.results if r.ref is not None and r.ref.holder != holder]
        if foreign:
            return p.Error(Reason.BAD_RESULT, f"groups {foreign[:5]}: payloads held by another")
        data = [stored(r) for r in m.results]
        stores = {r.ref.store for r in m.results if r.ref is not None}
        if stores:  # a live process keeps its results in one store
            self.payloads.live[holder] = stores.pop()
        verdicts = [r.filtered for r in m.results]
        filtered = None if all(why is None for why in verdicts) else verdicts
        steps_before = self.core.state.steps_done
        critic_before = self.core.state.critic_steps_done
        reply = self.core.complete(
            m.lease_id, m.fence, gids, behaviour, data, m.durable_step, filtered
        )
        if isinstance(reply, Rejected):
            return error_of(reply)
        if lease is not None:
            for r in m.results:
                if r.ref is not None:
                    self.payloads.refs.noted(r.ref.store, r.ref.key, r.gid, lease.role)
            self.activity.add(lease.role, (m.metrics or {}).get(ACTIVITY_KEY), now)
        self.trace.settled(m.lease_id, "complete", self.core.state.leases, now)
        if self.core.state.steps_done > steps_before:
            self.step_lines.stepped(m, lease.worker if lease else m.worker, gids, now)
            return p.StepDone(reply.count, self.core.state.steps_done)
        if self.core.state.critic_steps_done > critic_before:
            # The critic's step goes into the next policy step's line of metrics.jsonl.
            self.step_lines.critic_stepped(m)
            return p.StepDone(reply.count, self.core.state.critic_steps_done)
        return p.Ack(reply.count)

    def fail(self, m: p.Fail, now: float) -> p.Message:
        gids = None if m.gids is None else list(m.gids)
        groups, lease = self.core.state.groups, self.core.state.leases.get(m.lease_id)
        lost: list[tuple[p.LostPayload, str]] = []  # each report, with who held the payload
        for x in m.lost:
            if lease is None or x.gid not in lease.gids:
                continue  # another reader reported it first: the group is out of this lease
            holder = holder_of(groups[x.gid].data.get(x.role))
            if holder is None:  # only a reference can be lost on its way
                return p.Error(Reason.BAD_REQUEST, f"group {x.gid} has no {x.role} reference")
            lost.append((x, holder))
        triples = [(x.gid, x.role, x.reason) for x, _ in lost]
        gone = [(x.gid, x.role) for x, holder in lost if self._holder_gone(groups[x.gid], x.role)]
        reply = self.core.fail(m.lease_id, m.fence, gids, m.reason, triples, gone)
        if isinstance(reply, Accepted):
            self.trace.settled(m.lease_id, "fail", self.core.state.leases, now)
            log.warning("work failed", worker=m.worker, lease=m.lease_id, reason=m.reason)
            for x, holder in lost:
                log.warning("payload lost", group=x.gid, role=x.role, holder=holder,
                            reader=m.worker, reason=x.reason)  # fmt: skip
        return reply_of(reply)

    def _holder_gone(self, group: Group, role: str) -> bool:
        """Whether the process that kept ``role``'s payload of ``group`` is no more (its
        worker left, or runs as a new process with a new store): no fault of the group."""
        kept = group.data.get(role)
        return self.payloads.live.get(holder_of(kept) or "") != store_of(kept)

    def held(self, m: p.Held, _now: float) -> p.Message:
        """Which of a store's keys no live group refers to any more: the store frees them."""
        self.payloads.reported[m.worker] = {"payloads": len(m.keys), "bytes": m.bytes}
        self.payloads.live[m.worker] = m.store
        live = self.payloads.refs.live(self.core.state.groups, m.store, m.keys)
        return p.Drop(tuple(k for k in m.keys if k not in live))

    def lock(self, m: p.Lock, _now: float) -> p.Message:
        reply = self.core.acquire(m.resource, m.lease_id, m.fence)
        if isinstance(reply, LockGranted):
            return p.LockGranted(reply.resource, reply.lease_id, reply.token)
        if isinstance(reply, LockQueued):
            return p.LockQueued(reply.resource, reply.lease_id, reply.position)
        return error_of(reply)

    def unlock(self, m: p.Unlock, _now: float) -> p.Message:
        return reply_of(self.core.release(m.resource, m.token))

    def add_groups(self, m: p.AddGroups, _now: float) -> p.Message:
        refused = self._not_the_entry_role(m.worker)
        if refused is not None:
            return refused
        keys = [g.key for g in m.groups]
        if len(set(keys)) != len(keys):
            return p.Error(Reason.BAD_REQUEST, "a key appears twice in one request")
        fresh = [g for g in m.groups if g.key not in self.core.state.keys]
        reply = self.core.add_groups(
            [g.key for g in fresh], [p.pack_payload(g.data) for g in fresh]
        )
        if isinstance(reply, Rejected):
            return error_of(reply)
        added = tuple(g.key for g in fresh)
        known = set(added)  # once, not per key: a request may carry hundreds of groups
        return p.Added(added, tuple(k for k in keys if k not in known))
