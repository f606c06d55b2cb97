"""Training rolls back: the rules for what is done again when the trainer's state (or the
critic's) is older than its step count (a lost host), part of ``CoreState`` (a base class
of it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.runtime.contract.stages import Gate, GroupState, Pipeline

from .effects import CriticRolledBackTo, Notice, RolledBackTo, WorkerLost
from .entities import Group, Lease, Worker
from .indexes import Indexes

__all__ = ["RollBack"]

DEAD = GroupState.DEAD


class RollBack:
    """``_roll_back`` and the groups it trains again; the state it changes is CoreState's."""

    pipeline: Pipeline
    workers: dict[str, Worker]
    leases: dict[int, Lease]
    groups: dict[int, Group]
    indexes: Indexes
    notices: list[Notice]
    regenerated: Counter[str]
    retained: dict[int, list[list[Any]]]
    counts: Counter[GroupState]
    critic_followers: frozenset[str]
    _policy_readers: dict[str, frozenset[GroupState]]
    _critic_done: frozenset[GroupState]  # the states of a group the critic has trained
    steps_done: int
    policy_version: int
    critic_steps_done: int
    critic_version: int
    rollbacks: int
    next_gid: int
    _fail: Callable[..., None]
    _redo: Callable[[Group, str, str], None]
    _add: Callable[[int, Sequence[str], Sequence[Any] | None], None]

    def _roll_back(self, step: int, reason: str, critic: bool = False) -> None:
        """Training is back at ``step``: the versions after it are lost, and so is all
        work that used their weights. The rule (DESIGN: durability of training):

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

        ``critic``: the critic's state is back at ``step`` instead (:meth:`_roll_back_critic`).
        """
        if critic:
            self._roll_back_critic(step, reason)
            return
        self.rollbacks += 1
        lost = sorted(
            w
            for w, known in self.workers.items()
            if (known.loaded or 0) > step and known.role not in self.critic_followers
        )
        # A critic step in flight is given back too: it may hold a group whose proximal
        # log-probs are made again below, and it completes its whole batch or nothing.
        batched = {s.role for s in self.pipeline.stages if s.gate.batched}
        for lease in sorted(self.leases.values(), key=lambda lease: lease.lid):
            if lease.worker in lost or lease.role in batched:
                self._fail(lease.lid, sorted(lease.gids), reason, counted=False)
        for worker in lost:
            self.indexes.left(self.workers.pop(worker))
            self.notices.append(WorkerLost(worker, reason))
        admit_role = self.pipeline.gated(Gate.ADMIT).role
        for gid in sorted(self.groups):
            group = self.groups[gid]
            if group.state is DEAD or group.behaviour is None:
                continue
            if group.behaviour[1] > step:
                self.regenerated[admit_role] += 1
                self._redo(group, admit_role, reason)
                continue
            for role, after in self._policy_readers.items():
                if role in group.done or group.state in after:
                    self._redo(group, role, reason)
        again = [kept for k in sorted(self.retained) if k > step for kept in self.retained[k]]
        self.retained = {k: kept for k, kept in self.retained.items() if k <= step}
        self._train_again(again)
        self.steps_done = step
        self.policy_version = min(self.policy_version, step)
        self.notices.append(RolledBackTo(step, len(again), reason))

    def _roll_back_critic(self, step: int, reason: str) -> None:
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
            for w, known in self.workers.items()
            if known.role in self.critic_followers and (known.loaded or 0) > step
        )
        critic_step = self.pipeline.gated(Gate.CRITIC_STEP)
        for lease in sorted(self.leases.values(), key=lambda lease: lease.lid):
            if lease.worker in lost or lease.role == critic_step.role:
                self._fail(lease.lid, sorted(lease.gids), reason, counted=False)
        for worker in lost:
            self.indexes.left(self.workers.pop(worker))
            self.notices.append(WorkerLost(worker, reason))
        (values,) = (s.role for s in self.pipeline.stages if s.reads_critic)
        for gid in sorted(self.groups):
            group = self.groups[gid]
            made_with = group.critic_version
            if made_with is None or made_with <= step or group.state in self._critic_done:
                continue
            self.regenerated[values] += 1
            self._redo(group, values, reason)
        self.critic_steps_done = step
        self.critic_version = min(self.critic_version, step)
        self.notices.append(CriticRolledBackTo(step, reason))

    def _train_again(self, trained: Sequence[Sequence[Any]]) -> None:
        """Groups a lost step trained, back as new groups with their prompts."""
        if not trained:
            return
        first = self.next_gid
        keys = [f"{key}#rollback{self.rollbacks}" for key, _ in trained]
        self._add(first, keys, [entry for _, entry in trained])
        for gid, (_, entry) in enumerate(trained, first):
            if entry is None:  # added without a payload the first time
                del self.groups[gid].data[self.pipeline.entry_role]
        self.counts[GroupState.TRAINED] -= len(trained)
        self.counts[GroupState.SUPERSEDED] += len(trained)
