"""The control plane's messages: membership, leases and their ends, locks, the run's state."""

from __future__ import annotations

from typing import Any, ClassVar

from .base import Kind, Payload, WireStruct, check_finite
from .data import Item, LostPayload, Result

# --- requests ---------------------------------------------------------------------------


class Hello(WireStruct):
    """First message of a worker: who it is. Answered by Ready, or Error on a mismatch."""

    KIND: ClassVar[Kind] = Kind.HELLO
    worker: str
    role: str
    protocol: int
    pid: int


class Heartbeat(WireStruct):
    """Alive. ``leases``: the ones the worker holds, the only ones renewed (None: all)."""

    KIND: ClassVar[Kind] = Kind.HEARTBEAT
    worker: str
    leases: tuple[int, ...] | None = None


class Claim(WireStruct):
    """Ask for up to ``n`` groups of the role's work (the dataloader: how many to add)."""

    KIND: ClassVar[Kind] = Kind.CLAIM
    worker: str
    role: str
    n: int


class Complete(WireStruct):
    """Results of a lease; a train step may add the step's metrics.

    ``claim_next``: the worker's next Claim, for up to that many groups, answered with the
    completion, so a busy worker makes one round trip per lease, not two. Once the results
    are taken the reply is the next Lease when there is work; otherwise the usual reply
    (Ack), the worker then waiting for a wake-up exactly as after a claim that found
    nothing. 0 (an older worker's, or a trainer's, whose StepDone must be published before
    it claims): no claim.
    """

    KIND: ClassVar[Kind] = Kind.COMPLETE
    worker: str
    lease_id: int
    fence: int
    results: tuple[Result, ...]
    metrics: Payload | None = None
    # a train step: the newest step whose state survives the loss of the trainer's host
    durable_step: int | None = None
    claim_next: int = 0


class Fail(WireStruct):
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


class Lock(WireStruct):
    KIND: ClassVar[Kind] = Kind.LOCK
    worker: str
    resource: str
    lease_id: int
    fence: int


class Unlock(WireStruct):
    KIND: ClassVar[Kind] = Kind.UNLOCK
    worker: str
    resource: str
    token: int


class Report(WireStruct):
    """A worker's measurement that belongs to no lease, e.g. a validation pass.

    ``name`` says what it is ("validation"); ``version`` is the policy version measured.
    """

    KIND: ClassVar[Kind] = Kind.REPORT
    worker: str
    name: str
    version: int
    data: Payload


class NewGroup(WireStruct):
    key: str
    data: Payload


class AddGroups(WireStruct):
    """New prompt groups; keys the scheduler already knows are skipped, not added twice."""

    KIND: ClassVar[Kind] = Kind.ADD_GROUPS
    worker: str
    groups: tuple[NewGroup, ...]


class Bye(WireStruct):
    """The worker is leaving on purpose (drained): its registration ends now."""

    KIND: ClassVar[Kind] = Kind.BYE
    worker: str
    reason: str


class Status(WireStruct):
    KIND: ClassVar[Kind] = Kind.STATUS


class Stop(WireStruct):
    """Drain: no new leases; the scheduler exits once running leases end."""

    KIND: ClassVar[Kind] = Kind.STOP
    reason: str


class Ready(WireStruct):
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
    critic_version: int = 0  # the same two for a learned critic (PPO's), if the run has one
    critic_steps_done: int = 0

    def __post_init__(self) -> None:
        check_finite("Ready", "heartbeat_interval_s", self.heartbeat_interval_s)
        check_finite("Ready", "lease_timeout_s", self.lease_timeout_s)


class Ack(WireStruct):
    KIND: ClassVar[Kind] = Kind.ACK
    count: int = 0


class Error(WireStruct):
    """A request was refused. ``code`` is a core Reason or a protocol-level one."""

    KIND: ClassVar[Kind] = Kind.ERROR
    code: str
    detail: str


class Lease(WireStruct):
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
        check_finite("Lease", "expires_in_s", self.expires_in_s)


class NoWork(WireStruct):
    KIND: ClassVar[Kind] = Kind.NO_WORK
    reason: str


class Want(WireStruct):
    """Reply to a dataloader's claim: how many new groups the pipeline can take now."""

    KIND: ClassVar[Kind] = Kind.WANT
    count: int


class Added(WireStruct):
    KIND: ClassVar[Kind] = Kind.ADDED
    added: tuple[str, ...]
    skipped: tuple[str, ...]


class LockGranted(WireStruct):
    KIND: ClassVar[Kind] = Kind.LOCK_GRANTED
    resource: str
    lease_id: int
    token: int


class LockQueued(WireStruct):
    KIND: ClassVar[Kind] = Kind.LOCK_QUEUED
    resource: str
    lease_id: int
    position: int


class StatusReply(WireStruct):
    KIND: ClassVar[Kind] = Kind.STATUS_REPLY
    summary: dict[str, Any]


# A Shutdown's reason once every step of the run is done (any other: a drain, a failure).
RUN_FINISHED = "the run is finished"


class Shutdown(WireStruct):
    """The run is over or draining: the worker finishes what it holds and exits."""

    KIND: ClassVar[Kind] = Kind.SHUTDOWN
    reason: str


class Event(WireStruct):
    """A PUB message. ``seq`` numbers every event, so a subscriber sees gaps."""

    KIND: ClassVar[Kind] = Kind.EVENT
    seq: int
    topic: str
    body: dict[str, Any]
