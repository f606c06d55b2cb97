"""Which idle workers to wake, and how many: one wake-up per new piece of work.

A worker whose claim found nothing waits for a wake-up event or its slow poll. If every
move that may mean work for a role woke every idle worker of the role, each group
reaching a stage would bring a claim from each of them, all but one answered "nothing":
with hundreds of scorers idle, the scheduler would spend most of its time refusing a herd
of claims, and the claim that wins waits behind it. So the scheduler keeps the workers
whose last claim found nothing, per role, oldest first, and wakes as many as the moves
brought groups, each on its own topic (``wake.<worker>/``, transport/topics.py).

Moves that widen a gate rather than bring groups (a step trained, a version published,
a straggler dead) and any move the entry role may follow wake every waiting worker of the
role: they are once a step, and which worker can use them is not known here.

Nothing here is journaled: after a restart no one is waiting, and every worker's slow
poll finds its way back in. An event may drop too; the poll covers that as well.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from asyncrl.runtime.contract.bus import wakeup_topics
from asyncrl.runtime.contract.stages import GroupState, Pipeline
from asyncrl.transport.topics import Topic, topic, wake_topic

__all__ = ["WaitingWorkers"]


class WaitingWorkers:
    """The workers of each role whose last claim found nothing, oldest first."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._waiting: dict[str, dict[str, None]] = {}  # role -> workers, in the order they came
        self._role_of: dict[str, str] = {}
        self._per_group: dict[str, tuple[str, ...]] = {}  # role -> topics that bring groups
        self._all: dict[str, tuple[str, ...]] = {}  # role -> topics that widen a gate
        run = topic(Topic.RUN)
        for role in pipeline.worker_roles:
            wakes = [t for t in wakeup_topics(role, pipeline) if t != run]  # run: its own SUB
            if role == pipeline.entry_role:
                self._all[role] = tuple(wakes)
                continue
            bring = _topics_that_bring_groups(role, pipeline)
            self._per_group[role] = tuple(t for t in wakes if t in bring)
            self._all[role] = tuple(t for t in wakes if t not in bring)

    def found_nothing(self, role: str, worker: str) -> None:
        """``worker``'s claim for ``role`` was answered with nothing to do."""
        self.claimed(worker)
        self._waiting.setdefault(role, {})[worker] = None
        self._role_of[worker] = role

    def claimed(self, worker: str) -> None:
        """``worker`` is not waiting (it got work, asked again, or is gone)."""
        role = self._role_of.pop(worker, None)
        if role is not None:
            self._waiting[role].pop(worker, None)

    def waiting(self, role: str) -> int:
        return len(self._waiting.get(role, ()))

    def to_wake(self, events: Iterable[tuple[str, dict[str, Any]]]) -> Iterator[str]:
        """The wake-up topics that ``events`` (topic, body) call for, each worker once."""
        wanted: dict[str, int] = {}  # role -> workers to wake; a huge number for all
        for name, body in events:
            for role, workers in self._waiting.items():
                if not workers:
                    continue
                if name.startswith(self._all.get(role, ())):
                    wanted[role] = len(workers)
                elif name.startswith(self._per_group.get(role, ())):
                    wanted[role] = wanted.get(role, 0) + max(1, len(body.get("groups", ())))
        for role, count in wanted.items():
            workers = self._waiting[role]
            for worker in list(islice(workers, count)):  # not the whole queue: a hot path
                self.claimed(worker)
                yield wake_topic(worker)


def _topics_that_bring_groups(role: str, pipeline: Pipeline) -> frozenset[str]:
    """The moves into a state ``role`` takes groups from: each brings that many groups."""
    topics = set()
    for stage in pipeline.for_role(role):
        for a, b in pipeline.edges():
            if b == stage.source and b not in (GroupState.TRAINED, GroupState.DEAD):
                topics.add(topic(Topic.TRANSITION, a.value, b.value))
        if stage.source == pipeline.entry:
            topics.add(topic(Topic.GROUPS, "added"))
    return frozenset(topics)
