"""Every message of the bus, declared once: its kind, its fields and their types.

A message is a frozen msgspec Struct with a ``KIND``; requests go from workers (and
observers) to the scheduler, replies come back, events go out on the PUB. Structs are
``array_like``: on the wire a message is the list of its fields in declaration order, and
trailing fields with defaults may be left out by an older sender. How they travel is
:mod:`.protocol`'s business; nothing here knows about frames.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any, ClassVar

from msgspec import Struct, field

__all__ = [
    "PROTOCOL_VERSION",
    "Ack",
    "AddGroups",
    "Added",
    "Bye",
    "Claim",
    "Complete",
    "Drop",
    "Error",
    "Event",
    "Fail",
    "Heartbeat",
    "Held",
    "Hello",
    "Item",
    "Kind",
    "Lease",
    "LoadedVersion",
    "Lock",
    "LockGranted",
    "LockQueued",
    "LostPayload",
    "Message",
    "NewGroup",
    "NoWork",
    "Payload",
    "PayloadRef",
    "PublishVersion",
    "Ready",
    "Report",
    "Result",
    "Rewind",
    "Shutdown",
    "Status",
    "StatusReply",
    "StepDone",
    "Stop",
    "Unlock",
    "Want",
    "WantWeights",
    "WeightsPlan",
]

PROTOCOL_VERSION = 2  # 2: payloads may travel as references (the data plane)

Payload = dict[str, Any]
"""A role's result for one group: str keys; values are MessagePack types or numpy arrays."""


class Kind(IntEnum):
    # worker -> scheduler (requests)
    HELLO = 1
    HEARTBEAT = 2
    CLAIM = 3
    COMPLETE = 4
    FAIL = 5
    LOCK = 6
    UNLOCK = 7
    PUBLISH_VERSION = 8
    LOADED_VERSION = 9
    ADD_GROUPS = 10
    BYE = 11
    REPORT = 12
    WANT_WEIGHTS = 13
    HELD = 14
    REWIND = 15
    # observers -> scheduler
    STATUS = 20
    STOP = 21
    # scheduler -> worker (replies)
    READY = 40
    ACK = 41
    ERROR = 42
    LEASE = 43
    NO_WORK = 44
    WANT = 45
    ADDED = 46
    LOCK_GRANTED = 47
    LOCK_QUEUED = 48
    STATUS_REPLY = 49
    SHUTDOWN = 50
    WEIGHTS_PLAN = 51
    DROP = 52
    STEP_DONE = 53
    # scheduler -> everyone (PUB)
    EVENT = 60


class _Struct(Struct, frozen=True, array_like=True, forbid_unknown_fields=True, gc=False):
    """Fields as a list (a longer list than declared is refused), immutable, and outside
    the cycle collector (messages hold no cycles; tracking thousands of small ones a second
    would cost collections). A new field goes last, with a default, so that an older
    sender's messages still decode."""


def _finite(owner: str, name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name}: {value!r} is not a finite number")


# --- requests ---------------------------------------------------------------------------


class Hello(_Struct):
    """First message of a worker: who it is. Answered by Ready, or Error on a mismatch."""

    KIND: ClassVar[Kind] = Kind.HELLO
    worker: str
    role: str
    protocol: int
    pid: int


class Heartbeat(_Struct):
    """Alive. ``leases``: the ones the worker holds, the only ones renewed (None: all)."""

    KIND: ClassVar[Kind] = Kind.HEARTBEAT
    worker: str
    leases: tuple[int, ...] | None = None


class Claim(_Struct):
    """Ask for up to ``n`` groups of the role's work (the dataloader: how many to add)."""

    KIND: ClassVar[Kind] = Kind.CLAIM
    worker: str
    role: str
    n: int


class PayloadRef(_Struct):
    """Where a payload lives on the data plane: the scheduler keeps this, never the bytes.

    ``holder`` is the worker that made it, serving at ``address``; ``store`` names that
    process's store (a restarted holder has a new one); ``checksum`` is the CRC-32C of the
    ``size`` bytes a fetch returns; ``host`` says which host's shared memory holds it, so
    that a reader there knows at once when the holder's store is gone.
    """

    holder: str
    address: str
    store: str
    key: int
    size: int
    checksum: int
    host: str = ""  # the holder's host identity when it keeps the payload in shared memory


class Result(_Struct):
    """One group's result; admitted work (generate) carries its (min, max) policy versions.

    The payload travels inline in ``data``, or, when ``ref`` is set, stays with the worker
    that made it and ``data`` is empty.
    """

    gid: int
    data: Payload
    behaviour: tuple[int, int] | None = None
    ref: PayloadRef | None = None


class Complete(_Struct):
    """Results of a lease; a train step may add the step's metrics."""

    KIND: ClassVar[Kind] = Kind.COMPLETE
    worker: str
    lease_id: int
    fence: int
    results: tuple[Result, ...]
    metrics: Payload | None = None
    # a train step: the newest step whose state survives the loss of the trainer's host
    durable_step: int | None = None


class LostPayload(_Struct):
    """A payload a consumer could not fetch intact: ``role``'s output for group ``gid``."""

    gid: int
    role: str
    reason: str


class Fail(_Struct):
    """Give groups of a lease back (all of them when ``gids`` is None) to be tried again.

    ``lost`` names payloads of the lease's groups that could not be fetched (holder gone,
    bytes corrupt): the stages that made them run again.
    """

    KIND: ClassVar[Kind] = Kind.FAIL
    worker: str
    lease_id: int
    fence: int
    gids: tuple[int, ...] | None
    reason: str
    lost: tuple[LostPayload, ...] = ()


class Lock(_Struct):
    KIND: ClassVar[Kind] = Kind.LOCK
    worker: str
    resource: str
    lease_id: int
    fence: int


class Unlock(_Struct):
    KIND: ClassVar[Kind] = Kind.UNLOCK
    worker: str
    resource: str
    token: int


class PublishVersion(_Struct):
    """The trainer made ``version`` available.

    ``weights``: the weight plane's manifest for it (opaque here, passed on to receivers),
    None where weights travel another way (files); ``address``: where the publisher serves
    them on the weight plane.
    """

    KIND: ClassVar[Kind] = Kind.PUBLISH_VERSION
    worker: str
    version: int
    weights: Payload | None = None
    address: bytes = b""


class LoadedVersion(_Struct):
    KIND: ClassVar[Kind] = Kind.LOADED_VERSION
    worker: str
    version: int


class Rewind(_Struct):
    """The trainer's state is at ``step``, behind the scheduler's step count (only an
    older checkpoint survived): training rolls back to it, exactly."""

    KIND: ClassVar[Kind] = Kind.REWIND
    worker: str
    step: int


class Report(_Struct):
    """A worker's measurement that belongs to no lease, e.g. a validation pass.

    ``name`` says what it is ("validation"); ``version`` is the policy version measured.
    """

    KIND: ClassVar[Kind] = Kind.REPORT
    worker: str
    name: str
    version: int
    data: Payload


class WantWeights(_Struct):
    """Whom to fetch ``version``'s weights from (0: the newest announced). Answered by
    WeightsPlan, or Error when no announcement for that version is held.

    ``address``: the asker's own weight-plane address if it can relay to others (b"": it
    cannot); ``failed``: a source that failed the asker (timed out, corrupt bytes), which
    it is not given again.
    """

    KIND: ClassVar[Kind] = Kind.WANT_WEIGHTS
    worker: str
    version: int
    address: bytes = b""
    failed: str = ""


class Held(_Struct):
    """The payloads a worker's ``store`` keeps (keys the scheduler acknowledged).

    Answered by Drop: the keys no live group refers to any more, which the store frees.
    """

    KIND: ClassVar[Kind] = Kind.HELD
    worker: str
    store: str
    keys: tuple[int, ...]
    bytes: int = 0  # what the store holds in all, pending keys included (for status)


class NewGroup(_Struct):
    key: str
    data: Payload


class AddGroups(_Struct):
    """New prompt groups; keys the scheduler already knows are skipped, not added twice."""

    KIND: ClassVar[Kind] = Kind.ADD_GROUPS
    worker: str
    groups: tuple[NewGroup, ...]


class Bye(_Struct):
    """The worker is leaving on purpose (drained): its registration ends now."""

    KIND: ClassVar[Kind] = Kind.BYE
    worker: str
    reason: str


class Status(_Struct):
    KIND: ClassVar[Kind] = Kind.STATUS


class Stop(_Struct):
    """Drain: no new leases; the scheduler exits once running leases end."""

    KIND: ClassVar[Kind] = Kind.STOP
    reason: str


# --- replies ----------------------------------------------------------------------------


class Ready(_Struct):
    """Hello accepted. Durations are the scheduler's, so every worker paces alike."""

    KIND: ClassVar[Kind] = Kind.READY
    worker: str
    run: str
    protocol: int
    heartbeat_interval_s: float
    lease_timeout_s: float
    max_message_bytes: int
    policy_version: int  # the newest published weights, for a generator to load first
    steps_done: int = 0  # train steps done: where a restarted trainer must resume

    def __post_init__(self) -> None:
        _finite("Ready", "heartbeat_interval_s", self.heartbeat_interval_s)
        _finite("Ready", "lease_timeout_s", self.lease_timeout_s)


class Ack(_Struct):
    KIND: ClassVar[Kind] = Kind.ACK
    count: int = 0


class Error(_Struct):
    """A request was refused. ``code`` is a core Reason or a protocol-level one."""

    KIND: ClassVar[Kind] = Kind.ERROR
    code: str
    detail: str


class Item(_Struct):
    """A leased group: its key and what earlier stages produced, by role.

    Payloads come inline in ``data`` or as references in ``refs``; a worker fetches the
    referenced ones into ``data`` before its actor sees the item.
    """

    gid: int
    key: str
    data: dict[str, Payload]
    refs: dict[str, PayloadRef] = field(default_factory=dict)


class Lease(_Struct):
    """Work for the worker until ``expires_in_s`` from now unless heartbeats renew it.

    Relative, not a timestamp: worker and scheduler clocks need not agree.
    """

    KIND: ClassVar[Kind] = Kind.LEASE
    lease_id: int
    fence: int
    role: str
    expires_in_s: float
    version: int | None
    items: tuple[Item, ...]

    def __post_init__(self) -> None:
        _finite("Lease", "expires_in_s", self.expires_in_s)


class NoWork(_Struct):
    KIND: ClassVar[Kind] = Kind.NO_WORK
    reason: str


class Want(_Struct):
    """Reply to a dataloader's claim: how many new groups the pipeline can take now."""

    KIND: ClassVar[Kind] = Kind.WANT
    count: int


class Added(_Struct):
    KIND: ClassVar[Kind] = Kind.ADDED
    added: tuple[str, ...]
    skipped: tuple[str, ...]


class LockGranted(_Struct):
    KIND: ClassVar[Kind] = Kind.LOCK_GRANTED
    resource: str
    lease_id: int
    token: int


class LockQueued(_Struct):
    KIND: ClassVar[Kind] = Kind.LOCK_QUEUED
    resource: str
    lease_id: int
    position: int


class StatusReply(_Struct):
    KIND: ClassVar[Kind] = Kind.STATUS_REPLY
    summary: dict[str, Any]


class Shutdown(_Struct):
    """The run is over or draining: the worker finishes what it holds and exits."""

    KIND: ClassVar[Kind] = Kind.SHUTDOWN
    reason: str


class WeightsPlan(_Struct):
    """Fetch ``version`` (its ``manifest``) from worker ``source`` at ``source_address``."""

    KIND: ClassVar[Kind] = Kind.WEIGHTS_PLAN
    version: int
    manifest: Payload
    source: str
    source_address: bytes


class StepDone(_Struct):
    """Reply to a train step's Complete: taken, and ``version`` is the step count, the
    version the trainer publishes next (no Status round trip to learn it)."""

    KIND: ClassVar[Kind] = Kind.STEP_DONE
    count: int
    version: int


class Drop(_Struct):
    """Reply to Held: the keys to free."""

    KIND: ClassVar[Kind] = Kind.DROP
    keys: tuple[int, ...]


# --- events -----------------------------------------------------------------------------


class Event(_Struct):
    """A PUB message. ``seq`` numbers every event, so a subscriber sees gaps."""

    KIND: ClassVar[Kind] = Kind.EVENT
    seq: int
    topic: str
    body: dict[str, Any]


Message = (
    Hello
    | Heartbeat
    | Claim
    | Complete
    | Fail
    | Lock
    | Unlock
    | PublishVersion
    | LoadedVersion
    | Rewind
    | Report
    | WantWeights
    | Held
    | AddGroups
    | Bye
    | Status
    | Stop
    | Ready
    | Ack
    | Error
    | Lease
    | NoWork
    | Want
    | Added
    | LockGranted
    | LockQueued
    | StatusReply
    | Shutdown
    | WeightsPlan
    | Drop
    | StepDone
    | Event
)
