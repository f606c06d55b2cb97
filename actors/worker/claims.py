"""When one worker claims work, and how much.

A claim rides on one of three requests: a Claim of its own, a Complete (``claim_next``:
the worker's next work asked for with its results) or the report of a version just loaded
(LoadedVersion ``claim_next``: an idle follower that loads a new version claims with the
report, one request instead of two). Each asks for the room the actor has. Whichever
carried it, a claim that found nothing leaves the worker queued at the scheduler, to be
woken by name when work comes: the worker claims again then, or after ``poll_s`` (a
wake-up may be lost).
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.transport import protocol as p

from ..actor import StreamingActor
from .leases import Leases

__all__ = ["Claims"]


class Claims:
    """The claiming state of one worker's loop: the actor it claims for, whether the run
    is over, and when to claim again after a claim found nothing."""

    def __init__(
        self,
        leases: Leases,
        clock: Callable[[], float],
        poll_s: float,
        *,
        publishes_versions: bool,
        stopping: Callable[[], bool],
    ) -> None:
        self._leases = leases
        self._clock = clock
        self._poll_s = poll_s
        self._publishes_versions = publishes_versions
        self._stopping = stopping
        self.actor: StreamingActor | None = None  # the loop's, while the loop runs
        self.run_over = False  # the scheduler said so: claim nothing more
        self._again_at = 0.0  # after a claim found nothing: not before this, or a wake-up

    def start(self, actor: StreamingActor) -> None:
        """The loop runs ``actor``: claim for it at once."""
        self.actor, self._again_at = actor, 0.0

    @property
    def open(self) -> bool:
        """Whether the worker takes new work (not leaving, the run not over)."""
        return not (self._stopping() or self.run_over)

    def due(self) -> bool:
        """Whether the loop should send a Claim now."""
        actor = self.actor
        return (
            actor is not None
            and self.open
            and self._clock() >= self._again_at
            and actor.capacity() > 0
        )

    def room(self) -> int:
        """How many groups a Complete, or a version's report, asks for with it: the actor's
        room; none before the loop runs, once the worker is leaving or the run is over, or
        for a publisher (a StepDone is published before the next claim)."""
        actor = self.actor
        if actor is None or not self.open or self._publishes_versions:
            return 0
        return actor.capacity()

    def found_nothing(self) -> None:
        """A claim found no work: the scheduler wakes this worker when some comes."""
        self._again_at = self._clock() + self._poll_s

    def woken(self) -> None:
        """Work was announced (or a version loaded that may admit some): claim now."""
        self._again_at = 0.0

    def with_report(self, reply: p.Message) -> None:
        """The reply to a version's report that claimed: a lease is tracked as a Claim's;
        an Ack found nothing."""
        if isinstance(reply, p.Lease):
            assert self.actor is not None
            self._leases.admit(self.actor, reply)
        elif isinstance(reply, p.Ack):
            self.found_nothing()
