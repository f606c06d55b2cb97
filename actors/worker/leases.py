"""The leases one worker holds, and how each ends.

Before the actor sees a lease its referenced payloads are fetched (a lease whose payloads
cannot be is handed back naming them, for their makers to redo); when the actor is done,
each failed group is handed back with a Fail and the results go out with a Complete,
large payloads kept here and referenced (data_plane.py); results that do not fit in the
store (a full /dev/shm) fail the lease with that reason. A Complete carries where the
loop's time went since the previous one (time_split.py) and the tokens the work covered,
and may carry the worker's next claim: its reply is then the next Lease when there is
work, which the loop admits like one answering a Claim. Heartbeats renew the leases
:attr:`Leases.holding` names, and no others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from asyncrl.runtime.contract.bus import ACTIVITY_KEY, TimeBucket
from asyncrl.runtime.contract.refusals import Reason
from asyncrl.transport import protocol as p
from asyncrl.transport.dataplane import StoreFull
from asyncrl.transport.link import LinkClosed

from ..actor import Outcome, StreamingActor
from .data_plane import LostPayloads, WorkerPayloads
from .requests import GaveUp
from .time_split import TimeSplit
from .version_tracking import describe_reply as _describe

__all__ = ["MAX_REASON", "Leases"]

MAX_REASON = 500  # characters of an exception kept in a Fail's reason
_LEASE_ENDED = frozenset({Reason.STALE_FENCE, Reason.UNKNOWN_LEASE})


class Leases:
    """What one worker holds and works on; ``call`` sends a request and returns its reply.

    ``results_are_read``: a later stage reads these results, so large ones are kept here
    and referenced rather than sent inline.
    """

    def __init__(
        self,
        worker: str,
        payloads: WorkerPayloads,
        call: Callable[[p.Message], p.Message],
        time_split: TimeSplit,
        log: Any,
        *,
        results_are_read: bool,
    ) -> None:
        self.worker = worker
        self.payloads = payloads
        self._call = call
        self._time = time_split
        self._log = log
        self._results_are_read = results_are_read
        self.settled = 0  # leases completed or failed, as the scheduler took them
        # The lease being worked on: heartbeats renew only it, so a lease whose reply never
        # reached this worker runs out instead of being kept alive.
        self.holding: tuple[int, ...] = ()
        self._running: dict[int, p.Lease] = {}  # a streaming actor's leases, by id

    def admit(self, actor: StreamingActor, lease: p.Lease) -> None:
        """Hand ``lease`` to the actor once what it references is fetched."""
        self.holding = (*self._running, lease.lease_id)
        resolved = self._resolved(lease)
        if resolved is not None:
            with self._time.spent_on(TimeBucket.COMPUTE):
                actor.admit(resolved)
            self._running[resolved.lease_id] = resolved
        self.holding = tuple(self._running)

    def finish(
        self, lease: p.Lease, outcome: Outcome, claim_next: int = 0
    ) -> p.Ack | p.StepDone | p.Lease | None:
        """End ``lease`` as ``outcome`` says: its failed groups handed back, its results
        completed, asking for up to ``claim_next`` groups more with them. The scheduler's
        reply to the Complete once it took it (the next Lease if one was granted); None if
        it did not, or there were no results to send."""
        self._running.pop(lease.lease_id, None)
        for gid, reason in outcome.failed:
            self._log.warning("group failed", lease=lease.lease_id, gid=gid, reason=reason)
            fail = p.Fail(self.worker, lease.lease_id, lease.fence, (gid,), reason[:MAX_REASON])
            with contextlib.suppress(GaveUp, LinkClosed):
                self.settle(fail)
        if not outcome.results:
            self.holding = tuple(self._running)
            return None
        taken = self._complete(lease, outcome, claim_next)  # held, so renewed, until answered
        self.holding = tuple(self._running)
        return taken

    def give_back(self, leases: list[p.Lease], reason: str) -> None:
        for lease in leases:
            self._running.pop(lease.lease_id, None)
            with contextlib.suppress(GaveUp, LinkClosed):
                self.settle(p.Fail(self.worker, lease.lease_id, lease.fence, None, reason))
        self.holding = tuple(self._running)

    def settle(self, message: p.Complete | p.Fail) -> p.Ack | p.StepDone | p.Lease | None:
        """Send a lease's end; the scheduler's reply once it took it, else None."""
        reply = self._call(message)
        if isinstance(reply, p.Ack | p.StepDone | p.Lease):  # a Lease: taken, and more work
            self.settled += 1
            return reply
        if isinstance(reply, p.Error) and reply.code in _LEASE_ENDED:
            self._log.warning("result dropped: lease ended", lease=message.lease_id)
            return None
        self._log.error("result refused", lease=message.lease_id, reply=_describe(reply))
        if isinstance(message, p.Complete):
            # Give the groups back now: heartbeats would otherwise keep the lease alive.
            reason = f"result refused: {_describe(reply)}"[:MAX_REASON]
            self.settle(p.Fail(self.worker, message.lease_id, message.fence, None, reason))
        return None

    def _complete(
        self, lease: p.Lease, outcome: Outcome, claim_next: int
    ) -> p.Ack | p.StepDone | p.Lease | None:
        """Send ``outcome``'s Complete, large payloads kept here and referenced; the
        scheduler's reply once it took it, else None."""
        results, kept = outcome.results, ()
        if self._results_are_read:
            try:
                with self._time.spent_on(TimeBucket.PAYLOADS):
                    results, kept = self.payloads.stash(outcome.results)
            except StoreFull as full:
                # The groups go back to be made again (here or elsewhere) once there is room.
                reason = str(full)[:MAX_REASON]
                self._log.error("results not kept", lease=lease.lease_id, reason=reason)
                with contextlib.suppress(GaveUp, LinkClosed):
                    self.settle(p.Fail(self.worker, lease.lease_id, lease.fence, None, reason))
                return None
        # The time up to here; sending this Complete counts towards the next one.
        spent = [round(s * 1e6) for s in self._time.take()]
        activity = {"tokens": outcome.tokens, "us": spent}
        metrics = {**(outcome.metrics or {}), ACTIVITY_KEY: activity}
        message = p.Complete(
            self.worker,
            lease.lease_id,
            lease.fence,
            results,
            metrics,
            outcome.durable_step,
            claim_next,
        )
        try:
            return self.settle(message)
        finally:
            # Taken or not, the scheduler's answers to Held free what it does not refer to.
            self.payloads.settled(kept)

    def _resolved(self, lease: p.Lease) -> p.Lease | None:
        """``lease`` with the payloads it references fetched; None if some could not be,
        in which case the lease was given back naming them, for their makers to redo."""
        try:
            with self._time.spent_on(TimeBucket.PAYLOADS):
                return self.payloads.resolve(lease)
        except LostPayloads as missing:
            reason = str(missing)[:MAX_REASON]
            self._log.warning("payloads unavailable", lease=lease.lease_id, reason=reason)
            fail = p.Fail(self.worker, lease.lease_id, lease.fence, None, reason, missing.lost)
            with contextlib.suppress(GaveUp, LinkClosed):
                self.settle(fail)
            return None
