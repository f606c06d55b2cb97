"""The core's durable state and ``apply``, the only code that changes it.

``CoreState.apply(record)`` is a pure function of the state and one record (see
``records.py``): the live core and a replay of its journal call the same code with the
same records, so they end in the same state. Indexes (indexes.py: which groups each stage
may take next, which leases expire first, each worker's leases) are derived and rebuilt
on restore, never journaled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.runtime.contract.stages import Gate, GroupState, Pipeline, Stage

from . import records as r
from .downstream import derived_roles, states_after
from .effects import (
    GroupsAdded,
    LockGranted,
    Notice,
    Transition,
    VersionLoaded,
    VersionPublished,
)
from .entities import NONE, Group, Lease, Resource, Worker
from .fences import FenceCipher
from .indexes import Indexes
from .rollback import RollBack

__all__ = ["CoreState"]

DEAD = GroupState.DEAD
EPOCH_SHIFT = 32  # 4 billion fences per epoch; MessagePack carries 64-bit ints


class CoreState(RollBack):
    """Everything the scheduler must not forget, plus indexes derived from it."""

    def __init__(
        self, pipeline: Pipeline, resources: dict[str, int], fences: FenceCipher | None = None
    ) -> None:
        self.pipeline = pipeline
        self.fences = fences or FenceCipher()
        self.groups: dict[int, Group] = {}
        # every key ever added, in order (a snapshot needs no sort of them all)
        self.keys: dict[str, None] = {}
        self.leases: dict[int, Lease] = {}
        self.workers: dict[str, Worker] = {}
        self.resources = {name: Resource(cap) for name, cap in sorted(resources.items())}
        self.next_gid = 0
        self.next_lid = 1
        self.fence = 0  # fences granted so far (epoch in the high bits); tokens: next_fence
        self.steps_done = 0
        self.policy_version = 0
        self.due: Counter[int] = Counter()  # train_by -> alive, untrained groups
        self.due_ready: Counter[int] = Counter()  # the same, among groups the trainer may take
        self.counts: Counter[GroupState] = Counter()
        self.epoch = 0  # restarts so far: the high bits of every fence and lease id
        self.worst_staleness = -1  # the most versions a trained group lagged its step
        # The critic's own count, version and worst lag (values' version behind its step).
        self.critic_steps_done = 0
        self.critic_version = 0
        self.worst_critic_staleness = -1
        # Training that a lost trainer could not keep is done again from what is kept here:
        # the newest step whose state survives the trainer's host, and per step after it
        # the [key, entry payload] of each group it trained.
        self.durable_step = 0
        self.retained: dict[int, list[list[Any]]] = {}
        self.rollbacks = 0
        self.notices: list[Notice] = []
        self._moves: dict[tuple[GroupState, GroupState, str | None], list[int]] = {}
        self.indexes = Indexes(pipeline)
        # per state: how many branches a group entering it waits for
        self._branches = {state: len(pipeline.consumers(state)) for state in GroupState}
        self.step_source = pipeline.gated(Gate.STEP).source
        self._admit_working = pipeline.gated(Gate.ADMIT).working
        self._handlers: dict[type, Callable[..., None]] = {
            r.Registered: self._register,
            r.Left: self._leave,
            r.Loaded: self._loaded,
            r.Added: self._add,
            r.LeaseGranted: self._lease,
            r.Renewed: self._renew,
            r.Completed: self._complete,
            r.Failed: self._fail,
            r.Killed: self._kill,
            r.Published: self._publish,
            r.Granted: self._grant,
            r.Waiting: self._wait,
            r.Unlocked: self._unlock,
            r.Resumed: self._resume,
            r.Lost: self._lose,
            r.Durable: self._durable,
            r.RolledBack: self._roll_back,
            r.Redone: self._redone,
        }
        unhandled = set(r.OPS) - self._handlers.keys()
        if unhandled:  # the core could journal them, and nothing here would apply them
            raise TypeError(f"no handler for {sorted(kind.__name__ for kind in unhandled)}")
        # per role: the roles whose payloads derive from its own (itself included), which a
        # lost payload of that role takes down with it
        self.derived = {s.role: derived_roles(pipeline, s) for s in pipeline.stages}
        # per stage that reads the policy: the states a group is in once that stage is done
        self._policy_readers = {
            s.role: states_after(pipeline, s) for s in pipeline.stages if s.reads_policy
        }
        self.regenerated: Counter[str] = Counter()  # payloads lost and made again, by role
        # roles whose workers load the critic's versions, not the policy's
        self.critic_followers = frozenset(s.role for s in pipeline.stages if s.reads_critic)
        critic_step = [s for s in pipeline.stages if s.gate is Gate.CRITIC_STEP]
        self._critic_done = frozenset(
            {DEAD}.union(*(states_after(pipeline, s) for s in critic_step))
        )

    def apply(self, record: r.Record | Sequence[Any]) -> None:
        """Apply one record: a named one, or a journal entry ``[opcode, *fields]``."""
        # Only a plain list or tuple is a journal entry: a named record of a type with no
        # handler must fail here, not be read as an entry whose first field is an opcode.
        if type(record) in (list, tuple):
            record = r.from_journal(record)
        self._handlers[type(record)](*record)
        for (source, target, reason), gids in self._moves.items():
            self.notices.append(Transition(source, target, tuple(gids), reason))
        self._moves.clear()

    def next_fence(self) -> int:
        """The token of the next lease or lock: unguessable, never one issued before."""
        return self.fences.token(self.fence + 1)

    # --- indexes ---------------------------------------------------------------------

    def available(self, stage: Stage) -> list[tuple[Any, int]]:
        """Heap of (order key, gid) that *may* be takeable; stale entries are skipped."""
        return self.indexes.available[stage]

    def expiry_heap(self) -> list[tuple[float, int]]:
        return self.indexes.expiry

    def offer(self, group: Group) -> None:
        self.indexes.offer(group)

    def leases_of(self, worker: str) -> list[Lease]:
        """The worker's live leases, in the order they were granted."""
        return self.indexes.leases_of(worker)

    def _move(self, group: Group, target: GroupState, reason: str | None = None) -> None:
        source, train_by = group.state, group.train_by
        if train_by is not None:
            if source == self.step_source:
                _bump(self.due_ready, train_by, -1)
            elif target == self.step_source:
                _bump(self.due_ready, train_by, 1)
        counts = self.counts
        counts[source] -= 1
        counts[target] += 1
        group.state = target
        self.indexes.moved(group, source)
        key = (source, target, reason)
        moved = self._moves.get(key)
        if moved is None:
            self._moves[key] = [group.gid]
        else:
            moved.append(group.gid)
        self.offer(group)

    # --- handlers, one per opcode ----------------------------------------------------

    def _register(self, worker: str, role: str) -> None:
        # A (re)started worker process holds no weights yet: it reports what it loads.
        if worker in self.workers:
            self.indexes.left(self.workers[worker])
        self.workers[worker] = Worker(role)
        self.indexes.joined(self.workers[worker])

    def _leave(self, worker: str) -> None:
        self.indexes.left(self.workers.pop(worker))

    def _loaded(self, worker: str, version: int) -> None:
        self.indexes.left(self.workers[worker])
        self.workers[worker].loaded = version
        self.indexes.joined(self.workers[worker])
        self.notices.append(VersionLoaded(worker, version))

    def _add(self, first_gid: int, keys: Sequence[str], data: Sequence[Any] | None) -> None:
        entry = self.pipeline.entry
        for gid, key in enumerate(keys, first_gid):
            group = Group(gid, key, entry)
            if data is not None:
                group.data[self.pipeline.entry_role] = data[gid - first_gid]
            self.groups[gid] = group
            self.keys[key] = None
            self.offer(group)
        self.next_gid = first_gid + len(keys)
        self.counts[entry] += len(keys)
        self.notices.append(GroupsAdded(tuple(range(first_gid, self.next_gid))))

    def _lease(
        self,
        lid: int,
        fence: int,
        role: str,
        source: str,
        worker: str,
        expires_at: float,
        gids: Sequence[int],
        version: int | None,
        train_by: int | None,
    ) -> None:
        stage = self.pipeline.stage_at(GroupState(source), role)
        lease = Lease(lid, fence, role, stage.source, worker, expires_at, set(gids), version)
        self.leases[lid] = lease
        self.next_lid = lid + 1
        self.fence += 1  # the record carries the token; the count moves on by one
        self.indexes.leased(lease)
        for gid in gids:
            group = self.groups[gid]
            group.leases[role] = lid
            if train_by is not None:
                group.train_by = train_by
                _bump(self.due, train_by, 1)
            if stage.working is not None:
                self._move(group, stage.working)

    def _renew(self, lids: Sequence[int], expires_at: float) -> None:
        for lid in lids:
            lease = self.leases[lid]
            lease.expires_at = expires_at
            self.indexes.renewed(lease)

    def _complete(
        self, lid: int, gids: Sequence[int], behaviour: Sequence | None, data: Sequence | None
    ) -> None:
        lease = self.leases[lid]
        stage = self.pipeline.stage_at(lease.source, lease.role)
        if stage.gate is Gate.STEP:
            self.steps_done += 1
        elif stage.gate is Gate.CRITIC_STEP:
            self.critic_steps_done += 1
        for i, gid in enumerate(gids):
            group = self.groups[gid]
            del group.leases[lease.role]
            if stage.reads_critic:
                group.critic_version = lease.version
            elif stage.gate is Gate.CRITIC_STEP and group.critic_version is not None:
                lag = self.critic_steps_done - 1 - group.critic_version
                self.worst_critic_staleness = max(self.worst_critic_staleness, lag)
            # whatever killed its workers, it was not this
            self.indexes.suspect_cleared(group, lease.role)
            if behaviour is not None:
                group.behaviour = (behaviour[i][0], behaviour[i][1])
            if data is not None:
                group.data[lease.role] = data[i]
            self._finish_branch(group, stage)
        self._release_groups(lease, gids)

    def _finish_branch(self, group: Group, stage: Stage) -> None:
        if self._branches[stage.source] > 1:
            group.done |= {stage.role}
            if len(group.done) < self._branches[stage.source]:
                return
            group.done = NONE
        if stage.gate is not Gate.STEP:
            self._move(group, stage.target)
            return
        self._forget_train_by(group)
        self._move(group, stage.target)
        if self.steps_done > self.durable_step:  # trained again if this step is lost
            entry = group.data.get(self.pipeline.entry_role)
            self.retained.setdefault(self.steps_done, []).append([group.key, entry])
        # Trained groups leave the table (their transition was journaled and published):
        # snapshots then hold the work in flight, however long the run.
        self.indexes.forgotten(group)
        del self.groups[group.gid]
        if group.behaviour is not None:
            lag = self.steps_done - 1 - group.behaviour[0]
            self.worst_staleness = max(self.worst_staleness, lag)

    def _fail(
        self,
        lid: int,
        gids: Sequence[int],
        reason: str,
        counted: bool = True,
        suspect: bool = False,
    ) -> None:
        lease = self.leases[lid]
        for gid in gids:
            group = self.groups[gid]
            del group.leases[lease.role]
            if counted:
                group.attempts[lease.role] = group.attempts.get(lease.role, 0) + 1
            if suspect:
                self.indexes.suspect_added(group, lease.role)
            if group.state != lease.source:
                if group.state == self._admit_working:
                    self._forget_train_by(group)  # it will be admitted afresh
                self._move(group, lease.source, reason)
            else:
                self.offer(group)
        self._release_groups(lease, gids)

    def _kill(self, gids: Sequence[int], reason: str) -> None:
        for gid in gids:
            group = self.groups[gid]
            for lid in set(group.leases.values()):
                self._release_groups(self.leases[lid], (gid,))
            group.leases.clear()
            group.done = NONE
            group.reason = reason
            self._forget_train_by(group)
            self._move(group, DEAD, reason)

    def _lose(self, lid: int, gid: int, role: str, reason: str, counted: bool = True) -> None:
        # ``lid`` is the lease of the consumer that found the payload gone; it and every
        # other lease working from the payload, or from what was derived from it, let go.
        group = self.groups[gid]
        if counted:
            group.attempts[role] = group.attempts.get(role, 0) + 1
        self.regenerated[role] += 1
        self._redo(group, role, reason)

    def _redo(self, group: Group, role: str, reason: str) -> None:
        """``role``'s payload of ``group`` is made again, and everything derived from it."""
        stage = self.pipeline.for_role(role)[0]
        derived = self.derived[role]
        for reader, held in list(group.leases.items()):
            if reader in derived:
                del group.leases[reader]
                self._release_groups(self.leases[held], (group.gid,))
        for kept in derived:
            group.data.pop(kept, None)
        if derived & self.critic_followers:
            group.critic_version = None
        if stage.working is not None:  # made again from its source state, admitted afresh
            group.done = NONE
            group.behaviour = None
            self._forget_train_by(group)
            self._move(group, stage.source, reason)
        elif group.state == stage.source:  # its sibling branches are still running
            group.done = group.done - {role} or NONE
            self.offer(group)
        else:  # joined or further on: back to wait for this branch alone
            siblings = {s.role for s in self.pipeline.consumers(stage.source)}
            group.done = frozenset(siblings - derived) or NONE
            self._move(group, stage.source, reason)

    def _durable(self, step: int) -> None:
        self.durable_step = max(self.durable_step, step)
        for kept in [k for k in self.retained if k <= self.durable_step]:
            del self.retained[kept]

    def _forget_train_by(self, group: Group) -> None:
        if group.train_by is None:
            return
        _bump(self.due, group.train_by, -1)
        if group.state == self.step_source:
            _bump(self.due_ready, group.train_by, -1)
        group.train_by = None

    def _resume(self, epoch: int) -> None:
        # A crash may lose the journal's unsynced tail, and with it grants that workers
        # already hold. Starting fences and lease ids in a new epoch means such a lost
        # grant can never collide with one issued after the restart.
        self.epoch = epoch
        base = epoch << EPOCH_SHIFT
        self.fence = max(self.fence, base)
        self.next_lid = max(self.next_lid, base + 1)

    def _redone(self, gids: Sequence[int], role: str, reason: str) -> None:
        for gid in gids:
            self.regenerated[role] += 1
            self._redo(self.groups[gid], role, reason)

    def _publish(self, version: int, critic: bool = False) -> None:
        if critic:
            self.critic_version = version
        else:
            self.policy_version = version
        self.notices.append(VersionPublished(version, critic))

    # --- leases end, locks follow ----------------------------------------------------

    def _release_groups(self, lease: Lease, gids: Sequence[int]) -> None:
        lease.gids.difference_update(gids)
        if lease.gids:
            return
        self.indexes.ended(lease)
        del self.leases[lease.lid]
        for resource in self.resources.values():
            if lease.lid in resource.waiting:
                resource.waiting.remove(lease.lid)
        for token, name in list(lease.locks.items()):
            self._unlock(name, token)

    def _grant(self, resource: str, lid: int, token: int) -> None:
        self.resources[resource].holders[token] = lid
        self.leases[lid].locks[token] = resource
        self.fence += 1
        self.notices.append(LockGranted(resource, lid, token))

    def _wait(self, resource: str, lid: int) -> None:
        self.resources[resource].waiting.append(lid)

    def _unlock(self, resource: str, token: int) -> None:
        held = self.resources[resource]
        lid = held.holders.pop(token)
        if lid in self.leases:
            del self.leases[lid].locks[token]
        if held.waiting:  # the next in line takes the freed slot under a new fence
            self._grant(resource, held.waiting.popleft(), self.next_fence())


def _bump(counter: Counter[int], key: int, delta: int) -> None:
    """Counts by train_by step, without the zeros: the staleness checks walk every key."""
    value = counter[key] + delta
    if value:
        counter[key] = value
    else:
        del counter[key]
