"""The actor contract: what a role's code provides, and what it is given.

A role subclasses :class:`Actor` (one lease at a time) or :class:`StreamingActor` (many
leases at once, in small steps) and fills in the hooks it needs; :mod:`.worker.loop` drives
it over the bus. Nothing here sees a socket, a retry or a heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.transport import protocol as p

if TYPE_CHECKING:  # the weights module brings torch, which roles without weights never load
    from asyncrl.runtime.contract.gangs import GangPlace
    from asyncrl.transport.weights.base import Announcement

__all__ = [
    "FINAL_VERSION_WAIT_S",
    "Actor",
    "ActorBroken",
    "OneLeaseAtATime",
    "Outcome",
    "RunCannotGoOn",
    "StreamingActor",
    "WorkerContext",
]

# When the run is over, how long a validating actor that lingers waits for the run's last
# version before it validates the newest it has (a trainer that died publishing it).
FINAL_VERSION_WAIT_S = 60.0


class ActorBroken(RuntimeError):
    """Raised by a hook when the actor cannot go on in this process (a training rank lost
    its group): the worker gives its leases back and exits non-zero, to be started afresh."""


class RunCannotGoOn(ActorBroken):
    """Raised by a hook when no restart of this worker can help either (no weights reach
    it, however long it waits): the worker exits with ``STOPS_THE_RUN`` and its reason,
    and its supervisor stops the run."""


@dataclass(frozen=True, slots=True)
class WorkerContext:
    """What an actor knows at start: who it is, the run's config and the scheduler's pace."""

    worker: str
    role: str
    config: RunConfig
    run: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    max_message_bytes: int
    policy_version: int  # the newest published weights when the worker registered
    index: int | None = None  # this worker's number within its role, if it was given one
    # ask_weights(version, address, failed): whom to fetch ``version`` (0: the newest) from,
    # as the scheduler plans it; ``address`` is this worker's own weight-plane address if it
    # can relay (b"": it cannot), ``failed`` a source that failed it. None when the scheduler
    # holds no announcement for that version. Main thread only: it talks over the link.
    ask_weights: Callable[[int, bytes, str], p.WeightsPlan | None] | None = None
    steps_done: int = 0  # train steps the scheduler counts: where a trainer must resume
    # rewind(step): for a trainer whose state is behind ``steps_done`` (its host was lost
    # and only an older checkpoint survived): the run rolls back to ``step``. Raises
    # RuntimeError with the scheduler's reason if refused. Main thread only.
    rewind: Callable[[int], None] | None = None
    # Every process of the run is on this host (its bus is ipc:// or loopback): the weight
    # plane listens on loopback only, and its buckets carry CRC-32C rather than MACs.
    local: bool = True


@dataclass(frozen=True, slots=True)
class Outcome:
    """What ``process`` made of a lease: one result per group, and a train step's metrics."""

    results: tuple[p.Result, ...]
    metrics: p.Payload | None = None
    tokens: int = 0  # tokens the work covered, for the role's tokens-per-second
    # a train step: the newest step whose state survives the loss of this host (a
    # checkpoint); the scheduler keeps what it needs to train later steps again until then
    durable_step: int | None = None
    # groups of the lease that failed, with the reason (an environment that raised): they
    # are given back to be tried again while ``results`` complete the others
    failed: tuple[tuple[int, str], ...] = ()


class Actor:
    """A role's code. Subclass it, set ``role``, and override the hooks the role needs.

    Hooks run on the worker's main thread, one at a time.
    """

    role: ClassVar[str]
    claim_size: ClassVar[int] = 1  # groups asked for per claim (the dataloader: per AddGroups)
    publishes_versions: ClassVar[bool] = False  # the trainer: announce each trained step
    # the versions it loads or publishes are the learned critic's, not the policy's
    follows_critic: ClassVar[bool] = False

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        """Problems with ``cfg`` this role can see before any process starts (one line
        each, naming the key): ``asyncrl run`` stops on them before starting anything."""
        return []

    def on_start(self, ctx: WorkerContext) -> None:
        """The worker is registered; load what the role needs."""

    def process(self, lease: p.Lease) -> Outcome:
        """Do the lease's work. Raise to give every group back to be tried again."""
        raise NotImplementedError(f"{type(self).__name__} does not process leases")

    def feed(self, wanted: int) -> Sequence[p.NewGroup]:
        """Up to ``wanted`` new groups (the dataloader). Keys already known are skipped."""
        raise NotImplementedError(f"{type(self).__name__} does not feed groups")

    def on_version(self, version: int) -> int | None:
        """``version`` was published: load it (or not); return the version now loaded.

        Only generators override this; the worker then reports what they load.
        """
        return None

    def on_publish(self, version: int) -> Announcement | None:
        """Make ``version``'s weights available before it is announced; raise to not.

        Return the weight plane's :class:`Announcement` (manifest, address) for the
        scheduler to plan receivers' fetches with, or None where weights need no plan.
        """
        return None

    def wake_within_s(self) -> float | None:
        """While idle, the longest the worker may wait for the scheduler's events before
        looking at this actor again: work that comes from elsewhere (a generator's HTTP
        requests) says nothing on the bus. None: the worker's own pace."""
        return None

    def take_reports(self) -> list[p.Report]:
        """Reports made since the last call (validation results); the worker sends them."""
        return []

    def on_run_over(self) -> None:
        """Every step of the run is done (the scheduler said so); ``abandon`` comes next.
        A generator keeps its validation then, to validate the run's last version."""

    def lingers(self) -> bool:
        """After :meth:`on_run_over`: whether the worker should stay, following versions
        and advancing while busy, for work of the actor's own (a final validation). The
        worker asks again each time it is idle; the default is to leave."""
        return False

    def on_stop(self) -> None:
        """The worker is leaving; release what ``on_start`` took."""

    def follow(self, cfg: RunConfig, place: GangPlace) -> int:
        """Serve as rank ``place.rank`` > 0 of a group led by this role's worker (rank 0).

        Only a role that forms groups of ranks overrides this; returns the exit status.
        """
        raise NotImplementedError(f"role {self.role!r} does not form groups of ranks")


class StreamingActor(Actor):
    """An actor that works on many leases at once, in small steps (the generator).

    The worker claims whenever ``capacity`` says there is room, hands each lease to
    ``admit``, and calls ``advance`` in between; versions load between two ``advance``
    calls, never inside one. A lease is completed as soon as ``advance`` returns it.
    """

    def capacity(self) -> int:
        """How many more groups to claim now (0: full)."""
        raise NotImplementedError

    def admit(self, lease: p.Lease) -> None:
        """Start working on ``lease`` beside what is already running."""
        raise NotImplementedError

    def advance(self) -> list[tuple[p.Lease, Outcome]]:
        """One small step of all running work; the leases it finished, with their results.

        Raise, and every running lease is given back (``abandon`` is called first).
        """
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        """Work is running (or queued) that ``advance`` will finish."""
        raise NotImplementedError

    def abandon(self) -> list[p.Lease]:
        """Drop every running lease and return them, so the worker can give them back."""
        raise NotImplementedError


class OneLeaseAtATime(StreamingActor):
    """A plain :class:`Actor` seen through the streaming contract, so the worker has one
    loop: room for one lease of ``claim_size`` groups, and ``advance`` is its ``process``.

    A ``process`` that raises leaves the lease held, so ``abandon`` hands it back.
    """

    def __init__(self, actor: Actor) -> None:
        self.actor = actor
        self.role = actor.role
        self._lease: p.Lease | None = None

    def capacity(self) -> int:
        return 0 if self._lease is not None else self.actor.claim_size

    def admit(self, lease: p.Lease) -> None:
        assert self._lease is None, "one lease at a time"
        self._lease = lease

    def advance(self) -> list[tuple[p.Lease, Outcome]]:
        assert self._lease is not None
        outcome = self.actor.process(self._lease)
        lease, self._lease = self._lease, None
        return [(lease, outcome)]

    @property
    def busy(self) -> bool:
        return self._lease is not None

    def abandon(self) -> list[p.Lease]:
        lease, self._lease = self._lease, None
        return [] if lease is None else [lease]

    def on_run_over(self) -> None:
        self.actor.on_run_over()

    def lingers(self) -> bool:
        return self.actor.lingers()
