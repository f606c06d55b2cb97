"""From the core's notices to bus events, and which events wake which role.

Events are wake-ups and observations; none is the only copy of anything (PUB/SUB may drop
them, and a worker also polls). Each carries a sequence number so that gaps are visible.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from asyncrl.runtime.core.effects import (
    GroupsAdded,
    LockGranted,
    Notice,
    Transition,
    VersionLoaded,
    VersionPublished,
    WorkerLost,
)
from asyncrl.runtime.core.pipeline import Gate, GroupState, Pipeline
from asyncrl.transport.protocol import Event
from asyncrl.transport.topics import Topic, topic

__all__ = ["EventNumbering", "describe", "wakeup_topics"]

ENTRY_ROLE = "dataloader"


def describe(notice: Notice) -> tuple[str, dict[str, Any]]:
    """The topic and body that announce ``notice``."""
    match notice:
        case Transition(source, target, groups, reason):
            body: dict[str, Any] = {"groups": list(groups)}
            if reason is not None:
                body["reason"] = reason
            return _transition_topic(source, target), body
        case GroupsAdded(groups):
            return topic(Topic.GROUPS, "added"), {"groups": list(groups)}
        case VersionPublished(version):
            return topic(Topic.VERSION, "published"), {"version": version}
        case VersionLoaded(worker, version):
            return topic(Topic.VERSION, "loaded"), {"worker": worker, "version": version}
        case LockGranted(resource, lease_id, token):
            body = {"resource": resource, "lease_id": lease_id, "token": token}
            return topic(Topic.LOCK, "granted"), body
        case WorkerLost(worker, reason):
            return topic(Topic.WORKER, "lost"), {"worker": worker, "reason": reason}
    raise TypeError(f"no event for {notice!r}")


@functools.cache
def _transition_topic(source: GroupState, target: GroupState) -> str:
    # Built once per edge: nearly every request moves a group, and the few edges repeat.
    return topic(Topic.TRANSITION, source.value, target.value)


class EventNumbering:
    """Numbers events in the order they are published (a subscriber sees any gap)."""

    def __init__(self) -> None:
        self.seq = 0

    def make(self, name: str, body: dict[str, Any]) -> Event:
        self.seq += 1
        return Event(self.seq, name, body)

    def from_notices(self, notices: Iterable[Notice]) -> list[Event]:
        return [self.make(*describe(n)) for n in notices]


def wakeup_topics(role: str, pipeline: Pipeline) -> list[str]:
    """Topic prefixes after which ``role`` may find new work. The run's end is in all."""
    edges = list(pipeline.edges())
    topics = {topic(Topic.RUN)}
    trained = [topic(Topic.TRANSITION, a, b) for a, b in edges if b is GroupState.TRAINED]
    died = [topic(Topic.TRANSITION, a, b) for a, b in edges if b is GroupState.DEAD]
    if role == ENTRY_ROLE:
        # Room for new groups opens as they are taken, trained, or die.
        entry = pipeline.entry
        topics.update(topic(Topic.TRANSITION, a, b) for a, b in edges if a == entry)
        topics.update(trained + died)
        return sorted(topics)
    for stage in pipeline.for_role(role):
        topics.update(topic(Topic.TRANSITION, a, b) for a, b in edges if b == stage.source)
        if stage.source == pipeline.entry:
            topics.add(topic(Topic.GROUPS, "added"))
        if stage.gate is Gate.ADMIT:
            # Admission widens when a step finishes or a new version can be loaded.
            topics.update(trained)
            topics.add(topic(Topic.VERSION, "published"))
        if stage.gate is Gate.STEP:
            # A step may wait for stragglers; their arrival or death unblocks it.
            topics.update(died)
    return sorted(topics)
