"""The scheduler core: commands in, replies and journal records and notices out.

``SchedulerCore`` is sans-IO. It never opens a socket or reads a clock: every command
that depends on time takes ``now``. Each command validates its input (a bad one is a
``Rejected`` reply, counted, never an exception), decides, and commits records through
``CoreState.apply`` (whose rules, one per record, are transitions.py's table); the
scheduler process drains the records into the journal and the notices onto the bus.

Worker liveness (last heartbeat) and refusal counters are soft state: they are not
journaled, since workers re-register and heartbeat after a restart anyway.

The core is composed of the rules it hands decisions to, each given the state it reads
and the core's commit: who is blamed when work ends badly, and when a group dies of it
(blame.py's ``Blame``); what the critic's step may take (critic_step.py's ``CriticStep``);
the version commands (version_commands.py's ``VersionCommands``).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Gate, Pipeline, Stage

from . import journal_records as r
from .blame import Blame
from .checks import Problem, completion_problem, membership_problem
from .codec import load_state
from .critic_step import CriticStep
from .effects import (
    Accepted,
    Grant,
    LockGranted,
    LockQueued,
    Notice,
    Rejected,
    WorkerLost,
)
from .entities import Lease
from .liveness import Liveness
from .settings import CoreSettings
from .staleness import admission_capacity, step_keeps_promises, train_by_step
from .transitions import CoreState
from .version_commands import VersionCommands

__all__ = ["SchedulerCore"]


class SchedulerCore:
    def __init__(
        self,
        settings: CoreSettings,
        pipeline: Pipeline = DEFAULT_PIPELINE,
        state: CoreState | None = None,
    ) -> None:
        """A core over ``state`` (a restored one), or over a fresh state."""
        self.settings = settings
        self.pipeline = pipeline
        if state is None:
            state = CoreState(pipeline, dict(settings.resources), settings.fences())
        self.state = state
        self.last_seen = Liveness(settings.worker_timeout)
        self.rejections: Counter[Reason] = Counter()
        self._records: list[tuple[Any, ...]] = []
        self._roles = set(pipeline.worker_roles)
        self._blame = Blame(state, settings, self._commit)
        self._critic = CriticStep(state, settings, pipeline, self._commit, self._step_ready)
        self._versions = VersionCommands(state, pipeline, self._commit, self._reject)

    # --- outbox ----------------------------------------------------------------------

    def drain(self) -> tuple[list[tuple[Any, ...]], list[Notice]]:
        """Records to journal and notices to publish since the last drain, in order."""
        records, self._records = self._records, []
        notices, self.state.notices = self.state.notices, []
        return records, notices

    def _commit(self, record: r.Record) -> None:
        self.state.apply(record)
        self._records.append(r.to_journal(record))

    def _reject(self, reason: Reason, detail: str) -> Rejected:
        self.rejections[reason] += 1
        return Rejected(reason, detail)

    # --- workers ---------------------------------------------------------------------

    def register(self, worker: str, role: str, now: float) -> Accepted | Rejected:
        if role not in self._roles:
            return self._reject(
                Reason.WRONG_ROLE, f"role {role!r} is not one of {sorted(self._roles)}"
            )
        # a restarted process holds nothing: the old one died holding what it had
        self._blame.revoke(worker, "worker registered again", died=True)
        self._commit(r.Registered(worker, role))
        self.last_seen.saw(worker, now)
        return Accepted()

    def heartbeat(
        self, worker: str, now: float, held: Sequence[int] | None = None
    ) -> Accepted | Rejected:
        """The worker is alive; its leases are renewed (only those in ``held``, if given).

        A worker names the leases it holds so that one it never received (the reply was
        lost) is not kept alive by its heartbeats: that lease runs out and its groups go
        back. Without ``held`` every lease of the worker is renewed.
        """
        if worker not in self.state.workers:
            return self._reject(Reason.UNKNOWN_WORKER, f"worker {worker!r} is not registered")
        self.last_seen.saw(worker, now)
        lids = [lease.lid for lease in self.state.leases_of(worker)]
        if held is not None:
            wanted = set(held)
            lids = [lid for lid in lids if lid in wanted]
        if lids:
            self._commit(r.Renewed(lids, now + self.settings.lease_timeout))
        return Accepted(len(lids))

    def worker_lost(self, worker: str, reason: str, died: bool = True) -> Accepted | Rejected:
        """The worker is gone (timed out, or left): its work goes back, its locks go free.
        ``died``: it did not leave on purpose, so its groups may be blamed (see blame.py)."""
        if worker not in self.state.workers:
            return self._reject(Reason.UNKNOWN_WORKER, f"worker {worker!r} is not registered")
        self._blame.revoke(worker, reason, died)
        self._commit(r.Left(worker))
        self.last_seen.forget(worker)
        self.state.notices.append(WorkerLost(worker, reason))
        return Accepted()

    def tick(self, now: float) -> int:
        """Expire overdue leases and silent workers. Returns how many leases ended."""
        ended = 0
        expiry = self.state.expiry_heap()
        while expiry and expiry[0][0] <= now:
            expires_at, lid = heapq.heappop(expiry)
            lease = self.state.leases.get(lid)
            if lease is None or lease.expires_at != expires_at:
                continue
            ended += 1
            seen = self.last_seen.get(lease.worker)
            if seen is None or seen + self.settings.lease_timeout <= now:
                # silent as long as a lease lasts: it died, with everything it held
                self._blame.revoke(lease.worker, "lease expired", died=True)
            else:  # alive, and never named it as held: the grant never reached it
                reason = f"{lease.role}: lease expired unclaimed by its worker"
                self._commit(r.Failed(lease.lid, sorted(lease.gids), reason, counted=False))
        timeout = self.settings.worker_timeout
        for worker in self.last_seen.silent(now):
            if worker in self.state.workers:
                self.worker_lost(worker, f"no heartbeat for {timeout:g}s")
            else:  # no longer registered (a roll back let it go): nothing to take back
                self.last_seen.forget(worker)
        return ended

    # --- data ------------------------------------------------------------------------

    def add_groups(
        self, keys: Sequence[str], data: Sequence[Any] | None = None
    ) -> Accepted | Rejected:
        """New prompt groups enter the pipeline; ``keys`` name them for the dataloader.

        ``data``, one payload per key (the prompt), goes to the stages with the group.
        """
        dupes = sorted({k for k in keys if k in self.state.keys} | _repeated(keys))
        if dupes:
            return self._reject(Reason.DUPLICATE_KEY, f"groups already known: {dupes[:5]}")
        if data is not None and len(data) != len(keys):
            return self._reject(Reason.BAD_REQUEST, f"{len(data)} payloads for {len(keys)} keys")
        if keys:
            self._commit(r.Added(self.state.next_gid, list(keys), _listed(data)))
        return Accepted(len(keys))

    # --- leases ----------------------------------------------------------------------

    def claim(self, role: str, worker: str, n: int, now: float) -> Grant | Rejected | None:
        """Lease up to ``n`` groups of ``role``'s work to ``worker``; None when there is none."""
        known = self.state.workers.get(worker)
        if known is None:
            return self._reject(Reason.UNKNOWN_WORKER, f"worker {worker!r} is not registered")
        if known.role != role:
            return self._reject(Reason.WRONG_ROLE, f"worker {worker!r} registered as {known.role}")
        if n < 1:
            return self._reject(Reason.BAD_REQUEST, f"claim of {n} items; ask for at least 1")
        for stage in self.pipeline.for_role(role):
            grant = self._claim_stage(stage, worker, n, now)
            if grant is not None:
                return grant
        return None

    def _claim_stage(
        self, stage: Stage, worker: str, n: int, now: float
    ) -> Grant | Rejected | None:
        version = train_by = None
        if stage.gate is Gate.ADMIT:
            version = self.state.workers[worker].loaded
            if version is None:
                return self._reject(
                    Reason.BAD_VERSION, f"{worker!r} has not reported a loaded version"
                )
            train_by = train_by_step(version, self.settings.max_staleness)
            n = min(n, self._admissible(train_by))
        elif stage.gate is Gate.STEP:
            n = self.settings.train_batch_groups if self._step_ready(stage) else 0
            version = self.state.steps_done  # the version this step trains from
        elif stage.gate is Gate.CRITIC_STEP:
            self._critic.redo_stale_values(stage)
            n = self._critic.batch(stage)
            version = self.state.critic_steps_done  # the critic version this step trains from
        elif stage.reads_critic:
            version = self.state.workers[worker].loaded
            if version is None:
                return self._reject(
                    Reason.BAD_VERSION, f"{worker!r} has not reported a loaded critic version"
                )
            if version < self._critic.oldest_allowed():
                return None  # what it made now would be too stale for the next critic step
        gids = self._blame.take(stage, worker, n)
        if not gids:
            return None
        s = self.state
        lid, fence, expires = s.next_lid, s.next_fence(), now + self.settings.lease_timeout
        self._commit(
            r.LeaseGranted(
                lid=lid,
                fence=fence,
                role=stage.role,
                source=stage.source.value,
                worker=worker,
                expires_at=expires,
                gids=gids,
                version=version,
                train_by=train_by,
            )
        )
        return Grant(lid, fence, stage.role, expires, tuple(gids), version)

    def _admissible(self, train_by: int) -> int:
        s = self.state
        return admission_capacity(s.due, s.steps_done, self.settings.train_batch_groups, train_by)

    def _step_ready(self, stage: Stage) -> bool:
        """One batch at a time, and only one that leaves every admitted group trainable."""
        s = self.state
        if s.indexes.by_role[stage.role]:
            return False
        batch = self.settings.train_batch_groups
        return s.counts[stage.source] >= batch and step_keeps_promises(
            s.due, s.due_ready, s.steps_done, batch
        )

    def complete(
        self,
        lease_id: int,
        fence: int,
        gids: Sequence[int],
        behaviour: Sequence[Sequence[int]] | None = None,
        data: Sequence[Any] | None = None,
        durable: int | None = None,
        filtered: Sequence[str | None] | None = None,
    ) -> Accepted | Rejected:
        """Results for ``gids`` of a lease; admitted work carries (min, max) versions each.

        ``data`` holds one payload per group, kept with the group for the next stages. A
        train step may say which step's state now survives the loss of the trainer's host
        (``durable``): the groups of steps up to it need not be kept to be trained again.
        A stage that filters may say, per group, why it carries no learning signal
        (``filtered``; None for one that does): such a group is filtered, never trained.
        Results for groups a sibling branch filtered while this lease held them are
        ignored: the worker could not know.
        """
        lease = self._held(lease_id, fence)
        if isinstance(lease, Rejected):
            return lease
        stage = self.pipeline.stage_at(lease.source, lease.role)
        if filtered is not None and not stage.filters:
            return self._reject(Reason.BAD_RESULT, f"a {lease.role} result cannot filter groups")
        if filtered is not None and len(filtered) != len(gids):
            return self._reject(
                Reason.BAD_RESULT, f"{len(filtered)} filter verdicts for {len(gids)} groups"
            )
        if lease.dropped and any(g in lease.dropped for g in gids):
            kept = [i for i, g in enumerate(gids) if g not in lease.dropped]
            if not kept:
                return Accepted(0)
            gids, behaviour, data, filtered = (
                None if seq is None else [seq[i] for i in kept]
                for seq in (gids, behaviour, data, filtered)
            )
        problem = completion_problem(stage, lease, gids, behaviour, self.state.policy_version)
        if problem is not None:
            return self._reject(*problem)
        if data is not None and len(data) != len(gids):
            return self._reject(Reason.BAD_RESULT, f"{len(data)} payloads for {len(gids)} groups")
        if durable is not None and (stage.gate is not Gate.STEP or durable < 0):
            return self._reject(Reason.BAD_REQUEST, f"durable step {durable} from {lease.role}")
        if durable is not None and durable > self.state.steps_done + 1:
            return self._reject(
                Reason.BAD_VERSION, f"durable step {durable} is ahead of the step it completes"
            )
        rows = None if behaviour is None else [[int(lo), int(hi)] for lo, hi in behaviour]
        if filtered is not None and all(why is None for why in filtered):
            filtered = None
        self._commit(r.Completed(lease.lid, list(gids), rows, _listed(data), _listed(filtered)))
        if durable is not None and durable > self.state.durable_step:
            self._commit(r.Durable(durable))
        return Accepted(len(gids))

    def fail(
        self,
        lease_id: int,
        fence: int,
        gids: Sequence[int] | None,
        reason: str,
        lost: Sequence[tuple[int, str, str]] = (),
        holder_gone: Collection[tuple[int, str]] = (),
    ) -> Accepted | Rejected:
        """Give groups back (all of the lease when ``gids`` is None) to be tried again.

        ``lost`` names payloads (gid, role, why) the worker could not fetch: each such
        group leaves the lease and goes back before the stage that made the payload,
        which runs again; the lease's other groups go back uncounted, since the worker
        was not at fault. A lost payload counts a try against its group unless its
        (gid, role) is in ``holder_gone``: the process that kept it is no more.
        """
        lease = self._held(lease_id, fence)
        if isinstance(lease, Rejected):
            return lease
        if gids is None:
            gids = sorted(lease.gids)
        else:  # groups a sibling branch filtered while this lease held them are gone
            gids = [g for g in gids if g not in lease.dropped]
            if not gids:
                return Accepted(0)
        problem = membership_problem(lease, gids) or self._lost_problem(lease, lost)
        if problem is not None:
            return self._reject(*problem)
        if not lost:
            self._blame.fail_groups(lease, gids, f"{lease.role}: {reason}")
            return Accepted(len(gids))
        for gid, role, why in lost:
            if gid in lease.gids:  # its first lost payload takes the group out of the lease
                counted = (gid, role) not in holder_gone
                self._blame.lose(lease, gid, role, f"{role} payload lost: {why}", counted)
        rest = [g for g in gids if g in lease.gids]
        if rest:
            self._commit(r.Failed(lease.lid, rest, f"{lease.role}: {reason}", counted=False))
        return Accepted(len(gids))

    def _lost_problem(self, lease: Lease, lost: Sequence[tuple[int, str, str]]) -> Problem | None:
        for gid, role, _ in lost:
            if gid not in lease.gids:
                continue  # another reader reported it first: the group already went back
            reads = self.pipeline.reads(self.pipeline.stage_at(lease.source, lease.role))
            if role not in reads:
                return Reason.BAD_REQUEST, f"a {lease.role} lease carries no {role} payload"
        return None

    def _held(self, lease_id: int, fence: int) -> Lease | Rejected:
        lease = self.state.leases.get(lease_id)
        if lease is None:
            if 0 < lease_id < self.state.next_lid:
                return self._reject(Reason.STALE_FENCE, f"lease {lease_id} has ended")
            return self._reject(Reason.UNKNOWN_LEASE, f"no lease {lease_id} was ever granted")
        if lease.fence != fence:
            return self._reject(Reason.STALE_FENCE, f"lease {lease_id}: fence {fence} is stale")
        return lease

    def filter_bound_passed(self) -> str | None:
        """Why the run must stop, once dynamic sampling filtered more groups in a row, none
        judged to carry signal between, than its bound allows: nothing the generators make
        carries signal, and going on would spin. None while within it."""
        bound, filtered = self.settings.max_filtered_in_a_row, self.state.filtered_in_a_row
        if not bound or filtered <= bound:
            return None
        batch = self.settings.train_batch_groups
        return (
            f"algorithm.filter_groups: {filtered} groups filtered in a row, none with signal "
            f"between (more than max_filtered_batches={bound // batch} batches of {batch}): "
            "the task gives no learning signal (any more); raise "
            "algorithm.filter_groups.max_filtered_batches to go on"
        )

    # --- locks -----------------------------------------------------------------------

    def acquire(
        self, resource: str, lease_id: int, fence: int
    ) -> LockGranted | LockQueued | Rejected:
        """Take one unit of ``resource`` for as long as the lease lives (or until released)."""
        held = self.state.resources.get(resource)
        if held is None:
            return self._reject(Reason.UNKNOWN_RESOURCE, f"no resource {resource!r}")
        lease = self._held(lease_id, fence)
        if isinstance(lease, Rejected):
            return lease
        if resource in lease.locks.values() or lease_id in held.waiting:
            return self._reject(
                Reason.BAD_REQUEST, f"lease {lease_id} already asked for {resource!r}"
            )
        if len(held.holders) < held.capacity:
            token = self.state.next_fence()
            self._commit(r.Granted(resource, lease_id, token))
            return LockGranted(resource, lease_id, token)
        self._commit(r.Waiting(resource, lease_id))
        return LockQueued(resource, lease_id, len(held.waiting))

    def release(self, resource: str, token: int) -> Accepted | Rejected:
        held = self.state.resources.get(resource)
        if held is None:
            return self._reject(Reason.UNKNOWN_RESOURCE, f"no resource {resource!r}")
        if token not in held.holders:
            return self._reject(Reason.STALE_FENCE, f"{resource!r}: token {token} is not held")
        self._commit(r.Unlocked(resource, token))
        return Accepted()

    # --- versions --------------------------------------------------------------------

    def publish_version(self, worker: str, version: int) -> Accepted | Rejected:
        """The trainer (or the critic) made ``version``'s weights available."""
        return self._versions.publish_version(worker, version)

    def rewind(self, worker: str, step: int) -> Accepted | Rejected:
        """The trainer's state (or the critic's) is back at ``step``: training rolls back."""
        return self._versions.rewind(worker, step)

    def loaded_version(self, worker: str, version: int) -> Accepted | Rejected:
        """The worker now runs ``version`` (of the critic, for one that reads it)."""
        return self._versions.loaded_version(worker, version)

    # --- restart ---------------------------------------------------------------------

    @classmethod
    def restore(
        cls,
        settings: CoreSettings,
        records: Iterable[Sequence[Any]],
        pipeline: Pipeline = DEFAULT_PIPELINE,
        snapshot: Mapping[str, Any] | None = None,
    ) -> SchedulerCore:
        """Rebuild a core from a snapshot (if any) and the records journaled after it."""
        state = None
        if snapshot is not None:
            state = load_state(pipeline, dict(settings.resources), snapshot, settings.fences())
        core = cls(settings, pipeline, state)
        for record in records:
            core.state.apply(record)
        core.state.notices.clear()
        return core

    def resume(self, now: float) -> None:
        """After a restart: a new fence epoch, and grace for workers that could not renew."""
        self._commit(r.Resumed(self.state.epoch + 1))
        for worker in self.state.workers:
            self.last_seen.saw(worker, now)
        lids = sorted(self.state.leases)
        if lids:
            self._commit(r.Renewed(lids, now + self.settings.lease_timeout))


def _listed(data: Sequence[Any] | None) -> list[Any] | None:
    return None if data is None else list(data)


def _repeated(keys: Sequence[str]) -> set[str]:
    return {key for key, count in Counter(keys).items() if count > 1}
