"""What the core's state is made of: groups, leases, workers and lockable resources.

Plain records with no behaviour: ``CoreState.apply`` (transitions.py) is the only code that
changes them, and codec.py writes and reads them in snapshots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncrl.runtime.contract.stages import GroupState

__all__ = ["NONE", "Group", "Lease", "Resource", "Worker"]

# What a group has done or is suspected of is a frozenset, replaced whole when it changes:
# most groups have none, and one shared empty value spares each an empty set (216 bytes).
NONE: frozenset[str] = frozenset()


@dataclass(slots=True)
class Group:
    gid: int
    key: str
    state: GroupState
    done: frozenset[str] = NONE  # branches finished at the current state
    leases: dict[str, int] = field(default_factory=dict)  # role -> lease now working on it
    attempts: dict[str, int] = field(default_factory=dict)  # role -> failed tries
    train_by: int | None = None  # the last train step the staleness bound allows
    behaviour: tuple[int, int] | None = None  # (min, max) policy version over its tokens
    critic_version: int | None = None  # the critic version its values were made with
    reason: str | None = None  # why it died
    data: dict[str, Any] = field(default_factory=dict)  # role -> its payload for this group
    # roles whose worker died holding it (among others): it is leased alone to them, and
    # the next such death counts against it
    suspects: frozenset[str] = NONE


@dataclass(slots=True)
class Lease:
    lid: int
    fence: int
    role: str
    source: GroupState
    worker: str
    expires_at: float  # runs out then unless renewed, on the scheduler's clock
    gids: set[int]
    version: int | None = None  # admitted work: the version the generator had loaded
    locks: dict[int, str] = field(default_factory=dict)  # token -> resource
    # groups let go of while leased because a sibling branch filtered them: the holder's
    # result for them is ignored, not refused (it could not know)
    dropped: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Worker:
    role: str
    # the version a generator has loaded (of the critic, for a worker that reads it)
    loaded: int | None = None


@dataclass(slots=True)
class Resource:
    capacity: int
    holders: dict[int, int] = field(default_factory=dict)  # token -> lid
    waiting: deque[int] = field(default_factory=deque)  # lids, first come first served
