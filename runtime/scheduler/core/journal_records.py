"""Journal records: the facts the core has decided, one named tuple each.

The core decides (which groups to lease, whether a completion is valid, who dies) and then
*applies* a record; applying is the only way its state changes. Replaying the same records
on a fresh core therefore rebuilds the same state, and a record states what happened, not
what was asked, so replay never re-runs a decision.

A payload is what a role produced for a group (a prompt, tokens, rewards), opaque to the
core: what the scheduler keeps of it (small bytes, or a reference to the worker keeping
it) is kept with the group under the role's name, handed to the next stages with their
leases, journaled with the completion that produced it, and forgotten when the group is
trained. So data that reached ``generated`` is never generated again, unless the worker
keeping it is lost before every stage took it (:class:`Lost`).

Each record is a named tuple declared below: the core builds them where it decides
(``scheduler.py`` and the rules it delegates to) and ``CoreState.apply`` applies them by
type through the table of rules in ``transitions.py``, each rule taking the record's fields
under the same names. In the journal a record is the plain
list ``[opcode, field, ...]`` (:func:`to_journal`); :func:`from_journal` reads one back.
Opcodes and field orders never change, so journals written by earlier versions replay; a
record may gain a trailing field with a default (``Failed.counted``), which older entries
simply lack.

A new kind of record takes the next opcode in :class:`Op` (a number is never reused), a
named tuple here listed in ``OPS`` and ``Record``, and a rule in ``transitions.TRANSITIONS``
taking its fields by name; ``transitions.py`` will not import with a record left without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any, NamedTuple

__all__ = [
    "Added",
    "Completed",
    "Durable",
    "Failed",
    "Granted",
    "Killed",
    "LeaseGranted",
    "Left",
    "Loaded",
    "Lost",
    "Op",
    "Published",
    "Record",
    "Redone",
    "Registered",
    "Renewed",
    "Resumed",
    "RolledBack",
    "Unlocked",
    "Waiting",
    "from_journal",
    "to_journal",
]


class Op(IntEnum):
    REGISTER = 1
    LOADED = 2
    ADD = 3
    LEASE = 4
    RENEW = 5
    COMPLETE = 6
    FAIL = 7
    KILL = 8
    PUBLISH = 9
    GRANT = 10
    WAIT = 11
    UNLOCK = 12
    LEAVE = 13
    RESUME = 14
    LOSE = 15
    DURABLE = 16
    ROLL_BACK = 17
    REDO = 18


class Registered(NamedTuple):
    worker: str
    role: str


class Left(NamedTuple):
    """A worker's registration ended; its leases were failed first."""

    worker: str


class Loaded(NamedTuple):
    worker: str
    version: int


class Added(NamedTuple):
    """New groups in the entry state, gids from ``first_gid`` on, in order."""

    first_gid: int
    keys: Sequence[str]
    data: Sequence[Any] | None  # one entry payload per key


class LeaseGranted(NamedTuple):
    lid: int
    fence: int
    role: str
    source: str
    worker: str
    expires_at: float  # when the lease runs out unless renewed, on the scheduler's clock
    gids: Sequence[int]
    version: int | None  # admitted work: the version the generator had loaded
    train_by: int | None  # admitted work: the last step the staleness bound allows


class Renewed(NamedTuple):
    lids: Sequence[int]
    expires_at: float


class Completed(NamedTuple):
    """``filtered``, from a stage that filters: per group, why it carries no learning
    signal (it goes to ``filtered``, out of every lease), or None (it goes on as ever)."""

    lid: int
    gids: Sequence[int]
    behaviour: Sequence[Sequence[int]] | None  # [[vmin, vmax], ...] for admitted work
    data: Sequence[Any] | None  # what the scheduler keeps of each group's result
    filtered: Sequence[str | None] | None = None


class Failed(NamedTuple):
    """Back to the lease's source state; attempt + 1 unless the groups were given back
    for another's fault (a payload lost upstream, a worker that died holding others too).
    ``suspect``: the lease's worker died holding them, so each is suspected of the death
    (``blame.py``: who is blamed for a death)."""

    lid: int
    gids: Sequence[int]
    reason: str
    counted: bool = True
    suspect: bool = False


class Killed(NamedTuple):
    """To ``dead``, out of any lease."""

    gids: Sequence[int]
    reason: str


class Published(NamedTuple):
    version: int
    critic: bool = False  # a version of the critic (its step), not of the policy


class Redone(NamedTuple):
    """``role``'s payloads of ``gids`` are made again: they were made with a critic version
    the staleness bound no longer allows (the groups go back to wait for that stage)."""

    gids: Sequence[int]
    role: str
    reason: str


class Granted(NamedTuple):
    """A lock taken under a lease."""

    resource: str
    lid: int
    token: int


class Waiting(NamedTuple):
    """Queued for a full resource."""

    resource: str
    lid: int


class Unlocked(NamedTuple):
    resource: str
    token: int


class Resumed(NamedTuple):
    """A restart: fences and lease ids jump to a new epoch."""

    epoch: int


class Lost(NamedTuple):
    """``role``'s payload of ``gid`` is gone: the group leaves every lease reading it and
    goes back before the stage that made it, what was derived from it dropped."""

    lid: int
    gid: int
    role: str
    reason: str
    counted: bool = True  # False: its holder died, which is no fault of the group


class Durable(NamedTuple):
    """The trainer's state after ``step`` survives the loss of its host (a checkpoint):
    what was kept to train the groups of steps up to it again is let go."""

    step: int


class RolledBack(NamedTuple):
    """The trainer's state is back at ``step``: the steps after it, and everything made
    with their weights, are done again (``transitions._rolled_back`` states the rule).
    ``critic``: the critic's state, its steps and versions (``_critic_rolled_back``)."""

    step: int
    reason: str
    critic: bool = False  # an entry from before the critic rolled back: the trainer's


Record = (
    Registered
    | Left
    | Loaded
    | Added
    | LeaseGranted
    | Renewed
    | Completed
    | Failed
    | Killed
    | Published
    | Granted
    | Waiting
    | Unlocked
    | Resumed
    | Lost
    | Durable
    | RolledBack
    | Redone
)

OPS: dict[type, Op] = {
    Registered: Op.REGISTER,
    Left: Op.LEAVE,
    Loaded: Op.LOADED,
    Added: Op.ADD,
    LeaseGranted: Op.LEASE,
    Renewed: Op.RENEW,
    Completed: Op.COMPLETE,
    Failed: Op.FAIL,
    Killed: Op.KILL,
    Published: Op.PUBLISH,
    Granted: Op.GRANT,
    Waiting: Op.WAIT,
    Unlocked: Op.UNLOCK,
    Resumed: Op.RESUME,
    Lost: Op.LOSE,
    Durable: Op.DURABLE,
    RolledBack: Op.ROLL_BACK,
    Redone: Op.REDO,
}
_BY_OP: dict[int, type] = {op: kind for kind, op in OPS.items()}
assert len(_BY_OP) == len(Op), "every opcode has one record type"


def to_journal(record: Record) -> tuple[Any, ...]:
    """The journal's form of ``record``: ``(opcode, *fields)``."""
    return (OPS[type(record)], *record)


def from_journal(entry: Sequence[Any]) -> Record:
    """The record a journal entry (a list, as MessagePack gives it back) stands for."""
    return _BY_OP[entry[0]](*entry[1:])
