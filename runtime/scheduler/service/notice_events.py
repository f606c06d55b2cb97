"""From the core's notices to bus events (which events wake which role:
``runtime/contract/bus.py``).

Events are wake-ups and observations; none is the only copy of anything (PUB/SUB may drop
them, and a worker also polls). Each carries a sequence number so that gaps are visible.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from asyncrl.runtime.contract.stages import GroupState
from asyncrl.runtime.scheduler.core.effects import (
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
from asyncrl.transport.protocol import Event
from asyncrl.transport.topics import Topic, topic

__all__ = ["EventNumbering", "describe"]


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
        case VersionPublished(version, critic=True):
            return topic(Topic.VERSION, "critic_published"), {"version": version}
        case VersionPublished(version):
            return topic(Topic.VERSION, "published"), {"version": version}
        case VersionLoaded(worker, version):
            return topic(Topic.VERSION, "loaded"), {"worker": worker, "version": version}
        case LockGranted(resource, lease_id, token):
            body = {"resource": resource, "lease_id": lease_id, "token": token}
            return topic(Topic.LOCK, "granted"), body
        case WorkerLost(worker, reason):
            return topic(Topic.WORKER, "lost"), {"worker": worker, "reason": reason}
        case RolledBackTo(step, trained_again, reason):
            body = {"version": step, "trained_again": trained_again, "reason": reason}
            return topic(Topic.VERSION, "rolled_back"), body
        case CriticRolledBackTo(step, reason):
            return topic(Topic.VERSION, "critic_rolled_back"), {"version": step, "reason": reason}
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
