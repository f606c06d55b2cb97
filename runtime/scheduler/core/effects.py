"""What the core gives back: replies to the caller and notices for everyone else.

Replies are returned by the command that caused them. Notices (a group moved, a version
was published, a lock was granted) and journal records accumulate in the core's outbox;
the I/O shell drains them and turns them into PUB messages and journal appends.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import GroupState

__all__ = [
    "Accepted",
    "CriticRolledBackTo",
    "Grant",
    "GroupsAdded",
    "LockGranted",
    "LockQueued",
    "Notice",
    "Rejected",
    "RolledBackTo",
    "Transition",
    "VersionLoaded",
    "VersionPublished",
    "WorkerLost",
]


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: Reason
    detail: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Accepted:
    count: int = 0


@dataclass(frozen=True, slots=True)
class Grant:
    """A lease: the groups are this worker's until ``expires_at`` unless renewed."""

    lease_id: int
    fence: int
    role: str
    expires_at: float
    groups: tuple[int, ...]
    # Admitted work: the version the generator had loaded; a train step: the version it
    # trains from (the steps done before it).
    version: int | None = None


@dataclass(frozen=True, slots=True)
class LockGranted:
    resource: str
    lease_id: int
    token: int


@dataclass(frozen=True, slots=True)
class LockQueued:
    resource: str
    lease_id: int
    position: int


@dataclass(frozen=True, slots=True)
class Transition:
    source: GroupState
    target: GroupState
    groups: tuple[int, ...]
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class GroupsAdded:
    groups: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class VersionPublished:
    version: int
    critic: bool = False  # a version of the critic, not of the policy


@dataclass(frozen=True, slots=True)
class VersionLoaded:
    worker: str
    version: int


@dataclass(frozen=True, slots=True)
class WorkerLost:
    worker: str
    reason: str


@dataclass(frozen=True, slots=True)
class RolledBackTo:
    """Training went back to ``step``; ``trained_again`` groups will be trained again."""

    step: int
    trained_again: int
    reason: str


@dataclass(frozen=True, slots=True)
class CriticRolledBackTo:
    """The critic went back to ``step``: its later steps' updates and versions are lost."""

    step: int
    reason: str


Notice = (
    Transition
    | GroupsAdded
    | VersionPublished
    | VersionLoaded
    | LockGranted
    | WorkerLost
    | RolledBackTo
    | CriticRolledBackTo
)
