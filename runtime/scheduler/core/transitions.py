"""The core's durable state and the record-to-effect rules, the only code that changes it.

The core decides elsewhere (scheduler.py, blame.py, critic_step.py, version_commands.py)
and states each decision as a journal record (journal_records.py). ``CoreState.apply``
looks the record's type up in :data:`TRANSITIONS`, the table at the end of this module,
and runs its rule: one function per record type, taking the state and the record's fields
under the same names. A rule is a pure function of the state and one record: the live core
and a replay of its journal run the same rules on the same records, so they end in the
same state. A record type with no rule fails the import of this module.

``CoreState`` holds the fields and the bookkeeping that keeps their derived parts in step
(``move``: the counts per state, the train-by counters, the indexes). Indexes (indexes.py:
which groups each stage may take next, which leases expire first, each worker's leases)
are derived and rebuilt on restore, never journaled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.runtime.contract.stages import Gate, GroupState, Pipeline, Stage

from . import journal_records as r
from .downstream import derived_roles, states_after
from .effects import (
    CriticRolledBackTo,
    GroupsAdded,
    LockGranted,
    Notice,
    RolledBackTo,
    Transition,
    VersionLoaded,
    VersionPublished,
    WorkerLost,
)
from .entities import NONE, Group, Lease, Resource, Worker
from .fences import FenceCipher
from .indexes import Indexes

__all__ = ["TRANSITIONS", "CoreState"]

DEAD = GroupState.DEAD
FILTERED = GroupState.FILTERED
EPOCH_SHIFT = 32  # 4 billion fences per epoch; MessagePack carries 64-bit ints


class CoreState:
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
        # groups filtered since the last one judged to carry signal (dynamic sampling's bound)
        self.filtered_in_a_row = 0
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
        self.regenerated: Counter[str] = Counter()  # payloads lost and made again, by role
        self.indexes = Indexes(pipeline)
        self._moves: dict[tuple[GroupState, GroupState, str | None], list[int]] = {}
        # What the rules look up, read once from the stage table:
        # per state, how many branches a group entering it waits for
        self.branches = {state: len(pipeline.consumers(state)) for state in GroupState}
        self.step_source = pipeline.gated(Gate.STEP).source
        self.admit_working = pipeline.gated(Gate.ADMIT).working
        # per role: the roles whose payloads derive from its own (itself included), which a
        # lost payload of that role takes down with it
        self.derived = {s.role: derived_roles(pipeline, s) for s in pipeline.stages}
        # per stage that reads the policy: the states a group is in once that stage is done
        self.policy_readers = {
            s.role: states_after(pipeline, s) for s in pipeline.stages if s.reads_policy
        }
        # roles whose workers load the critic's versions, not the policy's
        self.critic_followers = frozenset(s.role for s in pipeline.stages if s.reads_critic)
        critic_step = [s for s in pipeline.stages if s.gate is Gate.CRITIC_STEP]
        # the states of a group the critic has trained
        self.critic_done = frozenset(
            {DEAD}.union(*(states_after(pipeline, s) for s in critic_step))
        )

    def apply(self, record: r.Record | Sequence[Any]) -> None:
        """Apply one record: a named one, or a journal entry ``[opcode, *fields]``."""
        # Only a plain list or tuple is a journal entry: a named record of a type with no
        # rule must fail here, not be read as an entry whose first field is an opcode.
        if type(record) in (list, tuple):
            record = r.from_journal(record)
        TRANSITIONS[type(record)](self, *record)
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

    # --- bookkeeping the rules share -------------------------------------------------

    def move(self, group: Group, target: GroupState, reason: str | None = None) -> None:
        """``group`` goes to ``target``: counts, train-by counters, indexes and the
        transition notice follow."""
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

    def forget_train_by(self, group: Group) -> None:
        """``group`` is no longer due by its train-by step (trained, dead, or to be
        admitted afresh)."""
        if group.train_by is None:
            return
        _bump(self.due, group.train_by, -1)
        if group.state == self.step_source:
            _bump(self.due_ready, group.train_by, -1)
        group.train_by = None


# --- workers ---------------------------------------------------------------------------


def _registered(s: CoreState, worker: str, role: str) -> None:
    # A (re)started worker process holds no weights yet: it reports what it loads.
    if worker in s.workers:
        s.indexes.left(s.workers[worker])
    s.workers[worker] = Worker(role)
    s.indexes.joined(s.workers[worker])


def _left(s: CoreState, worker: str) -> None:
    s.indexes.left(s.workers.pop(worker))


def _loaded(s: CoreState, worker: str, version: int) -> None:
    s.indexes.left(s.workers[worker])
    s.workers[worker].loaded = version
    s.indexes.joined(s.workers[worker])
    s.notices.append(VersionLoaded(worker, version))


def _resumed(s: CoreState, epoch: int) -> None:
    # A crash may lose the journal's unsynced tail, and with it grants that workers
    # already hold. Starting fences and lease ids in a new epoch means such a lost
    # grant can never collide with one issued after the restart.
    s.epoch = epoch
    base = epoch << EPOCH_SHIFT
    s.fence = max(s.fence, base)
    s.next_lid = max(s.next_lid, base + 1)


# --- groups and their leases -----------------------------------------------------------


def _added(s: CoreState, first_gid: int, keys: Sequence[str], data: Sequence[Any] | None) -> None:
    entry = s.pipeline.entry
    for gid, key in enumerate(keys, first_gid):
        group = Group(gid, key, entry)
        if data is not None:
            group.data[s.pipeline.entry_role] = data[gid - first_gid]
        s.groups[gid] = group
        s.keys[key] = None
        s.offer(group)
    s.next_gid = first_gid + len(keys)
    s.counts[entry] += len(keys)
    s.notices.append(GroupsAdded(tuple(range(first_gid, s.next_gid))))


def _lease_granted(
    s: CoreState,
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
    stage = s.pipeline.stage_at(GroupState(source), role)
    lease = Lease(lid, fence, role, stage.source, worker, expires_at, set(gids), version)
    s.leases[lid] = lease
    s.next_lid = lid + 1
    s.fence += 1  # the record carries the token; the count moves on by one
    s.indexes.leased(lease)
    for gid in gids:
        group = s.groups[gid]
        group.leases[role] = lid
        if train_by is not None:
            group.train_by = train_by
            _bump(s.due, train_by, 1)
        if stage.working is not None:
            s.move(group, stage.working)


def _renewed(s: CoreState, lids: Sequence[int], expires_at: float) -> None:
    for lid in lids:
        lease = s.leases[lid]
        lease.expires_at = expires_at
        s.indexes.renewed(lease)


def _completed(
    s: CoreState,
    lid: int,
    gids: Sequence[int],
    behaviour: Sequence | None,
    data: Sequence | None,
    filtered: Sequence[str | None] | None = None,
) -> None:
    lease = s.leases[lid]
    stage = s.pipeline.stage_at(lease.source, lease.role)
    if stage.gate is Gate.STEP:
        s.steps_done += 1
    elif stage.gate is Gate.CRITIC_STEP:
        s.critic_steps_done += 1
    for i, gid in enumerate(gids):
        group = s.groups[gid]
        del group.leases[lease.role]
        if stage.reads_critic:
            group.critic_version = lease.version
        elif stage.gate is Gate.CRITIC_STEP and group.critic_version is not None:
            lag = s.critic_steps_done - 1 - group.critic_version
            s.worst_critic_staleness = max(s.worst_critic_staleness, lag)
        # whatever killed its workers, it was not this
        s.indexes.suspect_cleared(group, lease.role)
        if filtered is not None and filtered[i] is not None:
            _filter(s, group, filtered[i])
            continue
        if stage.filters:  # judged, and it carries signal: the filtering is not starving
            s.filtered_in_a_row = 0
        if behaviour is not None:
            group.behaviour = (behaviour[i][0], behaviour[i][1])
        if data is not None:
            group.data[lease.role] = data[i]
        _finish_branch(s, group, stage)
    _release_groups(s, lease, gids)


def _finish_branch(s: CoreState, group: Group, stage: Stage) -> None:
    if s.branches[stage.source] > 1:
        group.done |= {stage.role}
        if len(group.done) < s.branches[stage.source]:
            return
        group.done = NONE
    if stage.gate is not Gate.STEP:
        s.move(group, stage.target)
        return
    s.forget_train_by(group)
    s.move(group, stage.target)
    if s.steps_done > s.durable_step:  # trained again if this step is lost
        entry = group.data.get(s.pipeline.entry_role)
        s.retained.setdefault(s.steps_done, []).append([group.key, entry])
    # Trained groups leave the table (their transition was journaled and published):
    # snapshots then hold the work in flight, however long the run.
    s.indexes.forgotten(group)
    del s.groups[group.gid]
    if group.behaviour is not None:
        lag = s.steps_done - 1 - group.behaviour[0]
        s.worst_staleness = max(s.worst_staleness, lag)


def _filter(s: CoreState, group: Group, reason: str) -> None:
    """``group`` carries no learning signal: it leaves the pipeline as ``filtered``.

    Its sibling branches' leases let go of it (what their holders later report for it is
    ignored: ``Lease.dropped``); its train-by promise is forgotten, so admission refills
    its slot at once (staleness.py), which is how batches stay full; and it leaves the
    table as a trained group does, its transition journaled, published and counted.
    """
    for held in group.leases.values():
        lease = s.leases[held]
        lease.dropped.add(group.gid)
        _release_groups(s, lease, (group.gid,))
    group.leases.clear()
    group.done = NONE
    s.forget_train_by(group)
    s.move(group, FILTERED, reason)
    s.indexes.forgotten(group)
    del s.groups[group.gid]
    s.filtered_in_a_row += 1


def _failed(
    s: CoreState,
    lid: int,
    gids: Sequence[int],
    reason: str,
    counted: bool = True,
    suspect: bool = False,
) -> None:
    lease = s.leases[lid]
    for gid in gids:
        group = s.groups[gid]
        del group.leases[lease.role]
        if counted:
            group.attempts[lease.role] = group.attempts.get(lease.role, 0) + 1
        if suspect:
            s.indexes.suspect_added(group, lease.role)
        if group.state != lease.source:
            if group.state == s.admit_working:
                s.forget_train_by(group)  # it will be admitted afresh
            s.move(group, lease.source, reason)
        else:
            s.offer(group)
    _release_groups(s, lease, gids)


def _killed(s: CoreState, gids: Sequence[int], reason: str) -> None:
    for gid in gids:
        group = s.groups[gid]
        for lid in set(group.leases.values()):
            _release_groups(s, s.leases[lid], (gid,))
        group.leases.clear()
        group.done = NONE
        group.reason = reason
        s.forget_train_by(group)
        s.move(group, DEAD, reason)


# --- payloads made again ---------------------------------------------------------------


def _lost(s: CoreState, lid: int, gid: int, role: str, reason: str, counted: bool = True) -> None:
    # ``lid`` is the lease of the consumer that found the payload gone; it and every
    # other lease working from the payload, or from what was derived from it, let go.
    group = s.groups[gid]
    if counted:
        group.attempts[role] = group.attempts.get(role, 0) + 1
    s.regenerated[role] += 1
    _redo(s, group, role, reason)


def _redone(s: CoreState, gids: Sequence[int], role: str, reason: str) -> None:
    for gid in gids:
        s.regenerated[role] += 1
        _redo(s, s.groups[gid], role, reason)


def _redo(s: CoreState, group: Group, role: str, reason: str) -> None:
    """``role``'s payload of ``group`` is made again, and everything derived from it."""
    stage = s.pipeline.for_role(role)[0]
    derived = s.derived[role]
    for reader, held in list(group.leases.items()):
        if reader in derived:
            del group.leases[reader]
            _release_groups(s, s.leases[held], (group.gid,))
    for kept in derived:
        group.data.pop(kept, None)
    if derived & s.critic_followers:
        group.critic_version = None
    if stage.gate is Gate.ADMIT:  # made again from its source state, admitted afresh
        group.done = NONE
        group.behaviour = None
        s.forget_train_by(group)
        s.move(group, stage.source, reason)
    elif stage.working is not None:
        # A step's result (the critic's values, when its step makes them): that step takes
        # the group again; it stays admitted, its rollouts and scores unchanged.
        group.done = NONE
        s.move(group, stage.source, reason)
    elif group.state == stage.source:  # its sibling branches are still running
        group.done = group.done - {role} or NONE
        s.offer(group)
    else:  # joined or further on: back to wait for this branch alone
        siblings = {sibling.role for sibling in s.pipeline.consumers(stage.source)}
        group.done = frozenset(siblings - derived) or NONE
        s.move(group, stage.source, reason)


# --- versions and training's durability ------------------------------------------------


def _published(s: CoreState, version: int, critic: bool = False) -> None:
    if critic:
        s.critic_version = version
    else:
        s.policy_version = version
    s.notices.append(VersionPublished(version, critic))


def _durable(s: CoreState, step: int) -> None:
    s.durable_step = max(s.durable_step, step)
    for kept in [k for k in s.retained if k <= s.durable_step]:
        del s.retained[kept]


def _rolled_back(s: CoreState, step: int, reason: str, critic: bool = False) -> None:
    """Training is back at ``step``: the versions after it are lost, and so is all work
    that used their weights. The rule (DESIGN: durability of training):

    - workers running on a lost version leave (their leases go back uncounted); they
      register again and load a version that exists;
    - a step in flight is given back, and so is a critic step;
    - a group with tokens of a lost version is generated again; one generated under
      kept versions keeps its tokens, but what stages that read the policy made for
      it (proximal log-probs) is computed again (a group the critic had trained then
      meets the critic again: the critic's own versions are not rolled back);
    - the groups the lost steps trained are trained again: their prompts (kept until
      their step was durable) come back as new groups, keyed ``<key>#rollback<n>``;
    - the step count and the published version return to ``step``.

    ``critic``: the critic's state is back at ``step`` instead (:func:`_critic_rolled_back`).
    """
    if critic:
        _critic_rolled_back(s, step, reason)
        return
    s.rollbacks += 1
    lost = sorted(
        w
        for w, known in s.workers.items()
        if (known.loaded or 0) > step and known.role not in s.critic_followers
    )
    # A critic step in flight is given back too: it may hold a group whose proximal
    # log-probs are made again below, and it completes its whole batch or nothing.
    batched = {row.role for row in s.pipeline.stages if row.gate.batched}
    for lease in sorted(s.leases.values(), key=lambda lease: lease.lid):
        if lease.worker in lost or lease.role in batched:
            _failed(s, lease.lid, sorted(lease.gids), reason, counted=False)
    for worker in lost:
        s.indexes.left(s.workers.pop(worker))
        s.notices.append(WorkerLost(worker, reason))
    admit_role = s.pipeline.gated(Gate.ADMIT).role
    for gid in sorted(s.groups):
        group = s.groups[gid]
        if group.state is DEAD or group.behaviour is None:
            continue
        if group.behaviour[1] > step:
            s.regenerated[admit_role] += 1
            _redo(s, group, admit_role, reason)
            continue
        for role, after in s.policy_readers.items():
            if role in group.done or group.state in after:
                _redo(s, group, role, reason)
    again = [kept for k in sorted(s.retained) if k > step for kept in s.retained[k]]
    s.retained = {k: kept for k, kept in s.retained.items() if k <= step}
    _train_again(s, again)
    s.steps_done = step
    s.policy_version = min(s.policy_version, step)
    s.notices.append(RolledBackTo(step, len(again), reason))


def _critic_rolled_back(s: CoreState, step: int, reason: str) -> None:
    """The critic is back at ``step``: its versions after it are lost, and so are the
    values made with them where the critic has yet to use them. The rule:

    - workers that loaded a lost critic version (values) leave (their leases go back
      uncounted); they register again and load a version that exists;
    - a critic step in flight is given back;
    - a group still on its way to the critic's step whose values were made with a lost
      version has them made again: the critic's step anchors its clip on them, and the
      critic's next versions never descend from the one that made them;
    - the groups the lost critic steps trained are not trained by the critic again: the
      critic only lost updates. The policy's data is unaffected: those groups keep the
      values they have (made by a critic that existed) for the train step's advantages;
    - the critic's step count and its published version return to ``step``.
    """
    lost = sorted(
        w
        for w, known in s.workers.items()
        if known.role in s.critic_followers and (known.loaded or 0) > step
    )
    critic_step = s.pipeline.gated(Gate.CRITIC_STEP)
    for lease in sorted(s.leases.values(), key=lambda lease: lease.lid):
        if lease.worker in lost or lease.role == critic_step.role:
            _failed(s, lease.lid, sorted(lease.gids), reason, counted=False)
    for worker in lost:
        s.indexes.left(s.workers.pop(worker))
        s.notices.append(WorkerLost(worker, reason))
    # Without a values stage (the critic's step makes them) no group waits with values
    # of a lost version: each step's values are its own, made as it trains.
    for values in (row.role for row in s.pipeline.stages if row.reads_critic):
        for gid in sorted(s.groups):
            group = s.groups[gid]
            made_with = group.critic_version
            if made_with is None or made_with <= step or group.state in s.critic_done:
                continue
            s.regenerated[values] += 1
            _redo(s, group, values, reason)
    s.critic_steps_done = step
    s.critic_version = min(s.critic_version, step)
    s.notices.append(CriticRolledBackTo(step, reason))


def _train_again(s: CoreState, trained: Sequence[Sequence[Any]]) -> None:
    """Groups a lost step trained, back as new groups with their prompts."""
    if not trained:
        return
    first = s.next_gid
    keys = [f"{key}#rollback{s.rollbacks}" for key, _ in trained]
    _added(s, first, keys, [entry for _, entry in trained])
    for gid, (_, entry) in enumerate(trained, first):
        if entry is None:  # added without a payload the first time
            del s.groups[gid].data[s.pipeline.entry_role]
    s.counts[GroupState.TRAINED] -= len(trained)
    s.counts[GroupState.SUPERSEDED] += len(trained)


# --- locks: a lease's end frees them ---------------------------------------------------


def _granted(s: CoreState, resource: str, lid: int, token: int) -> None:
    s.resources[resource].holders[token] = lid
    s.leases[lid].locks[token] = resource
    s.fence += 1
    s.notices.append(LockGranted(resource, lid, token))


def _waiting(s: CoreState, resource: str, lid: int) -> None:
    s.resources[resource].waiting.append(lid)


def _unlocked(s: CoreState, resource: str, token: int) -> None:
    held = s.resources[resource]
    lid = held.holders.pop(token)
    if lid in s.leases:
        del s.leases[lid].locks[token]
    if held.waiting:  # the next in line takes the freed slot under a new fence
        _granted(s, resource, held.waiting.popleft(), s.next_fence())


def _release_groups(s: CoreState, lease: Lease, gids: Sequence[int]) -> None:
    """``gids`` leave ``lease``; a lease left with none ends, and its locks go free."""
    lease.gids.difference_update(gids)
    if lease.gids:
        return
    s.indexes.ended(lease)
    del s.leases[lease.lid]
    for resource in s.resources.values():
        if lease.lid in resource.waiting:
            resource.waiting.remove(lease.lid)
    for token, name in list(lease.locks.items()):
        _unlocked(s, name, token)


def _bump(counter: Counter[int], key: int, delta: int) -> None:
    """Counts by train_by step, without the zeros: the staleness checks walk every key."""
    value = counter[key] + delta
    if value:
        counter[key] = value
    else:
        del counter[key]


# --- the table -------------------------------------------------------------------------

TRANSITIONS: dict[type, Callable[..., None]] = {
    r.Registered: _registered,
    r.Left: _left,
    r.Loaded: _loaded,
    r.Resumed: _resumed,
    r.Added: _added,
    r.LeaseGranted: _lease_granted,
    r.Renewed: _renewed,
    r.Completed: _completed,
    r.Failed: _failed,
    r.Killed: _killed,
    r.Lost: _lost,
    r.Redone: _redone,
    r.Published: _published,
    r.Durable: _durable,
    r.RolledBack: _rolled_back,
    r.Granted: _granted,
    r.Waiting: _waiting,
    r.Unlocked: _unlocked,
}
"""Each journal record type and the rule that applies it to a ``CoreState``."""

_unruled = set(r.OPS) - TRANSITIONS.keys()
if _unruled:  # the core could journal them, and nothing here would apply them
    raise TypeError(f"no rule for {sorted(kind.__name__ for kind in _unruled)}")
