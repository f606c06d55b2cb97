"""How one worker's requests reach the scheduler: sent again until answered, registering
again first when the scheduler forgot the worker.

Every request is retried on LinkTimeout with capped backoff (the scheduler may be
restarting), so a Complete whose reply was lost is sent again with the same lease and
fence, and the scheduler either takes it or says the lease ended. A stopping worker
retries only to end a lease it holds, and only for a while. The time until a reply is the
scheduler's (bus.TimeBucket.SCHEDULER), but for a claim that found nothing: that is
waiting for work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from asyncrl.runtime.contract.bus import TimeBucket
from asyncrl.runtime.contract.refusals import Reason
from asyncrl.transport import protocol as p
from asyncrl.transport.link import LinkTimeout

from .time_split import TimeSplit

__all__ = ["Fatal", "GaveUp", "Requests", "is_error"]

_FIRST_BACKOFF_S = 0.05


class Fatal(Exception):
    """The worker cannot go on (refused registration, an actor that fails to start)."""

    def __init__(self, reason: str, exit_code: int = 1) -> None:
        super().__init__(reason)
        self.exit_code = exit_code  # child_status.STOPS_THE_RUN: no restart can help


class GaveUp(Exception):
    """A request was abandoned because the worker is stopping."""


class Requests:
    """Sends one worker's requests until answered; ``request(message, timeout_s)`` is one
    try on the worker's link.

    ``stop_requests()`` is how often the worker was asked to stop (0: it is not stopping;
    twice: hurry); ``register_again()`` registers the worker again with a Hello, sent
    through :meth:`retry`, and raises Fatal if it is refused.
    """

    def __init__(
        self,
        request: Callable[[p.Message, float], p.Message],
        *,
        request_timeout_s: float,
        max_backoff_s: float,
        stop_retry_s: float,
        clock: Callable[[], float],
        time_split: TimeSplit,
        log: Any,
        stop_requests: Callable[[], int],
        register_again: Callable[[], None],
    ) -> None:
        self._request = request
        self.request_timeout_s = request_timeout_s
        self.max_backoff_s = max_backoff_s
        self.stop_retry_s = stop_retry_s
        self.clock = clock
        self._time = time_split
        self._log = log
        self._stop_requests = stop_requests
        self._register_again = register_again

    def call(self, message: p.Message, *, reregister: bool = True) -> p.Message:
        """The reply to ``message``; registers again first if the scheduler forgot us.

        Refused as not this connection's (the name went to another connection while this
        one was silent): registering again takes it back, or fails with the reason (a
        Hello refused is fatal); refused once more after that, retrying cannot help.
        """
        refused_sender = False
        while True:
            reply = self.retry(message)
            if not reregister:
                return reply
            if isinstance(reply, p.Error) and reply.code == Reason.WRONG_SENDER:
                if refused_sender:
                    raise Fatal(f"the scheduler refused this worker: {reply.detail}")
                refused_sender = True
            elif not is_error(reply, Reason.UNKNOWN_WORKER):
                return reply
            self._log.warning("the scheduler does not know this worker; registering again")
            self._register_again()

    def retry(self, message: p.Message) -> p.Message:
        """Send until a reply comes, backing off; a stopping worker gives up in time.

        The time until the reply is the scheduler's (waits after timeouts included), but
        for a claim that found nothing: that is waiting for work.
        """
        with self._time.spent_on(TimeBucket.SCHEDULER) as span:
            reply = self._send_until_answered(message)
            if _found_nothing(message, reply):
                span.charge_to(TimeBucket.WAITING_FOR_WORK)
            return reply

    def _send_until_answered(self, message: p.Message) -> p.Message:
        started, delay = self.clock(), _FIRST_BACKOFF_S
        while True:
            try:
                return self._request(message, self.request_timeout_s)
            except LinkTimeout:
                if self._should_give_up(message, started):
                    raise GaveUp(f"{type(message).__name__}: no reply while stopping") from None
                name = type(message).__name__
                self._log.warning("no reply from the scheduler; retrying", request=name, in_s=delay)
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def _should_give_up(self, message: p.Message, started: float) -> bool:
        """A stopping worker retries only to end a lease it holds, and only for a while."""
        stop_requests = self._stop_requests()
        if not stop_requests:
            return False
        if stop_requests > 1 or not isinstance(message, p.Complete | p.Fail):
            return True
        return self.clock() - started >= self.stop_retry_s


def is_error(reply: p.Message, code: str) -> bool:
    return isinstance(reply, p.Error) and reply.code == code


def _found_nothing(message: p.Message, reply: p.Message) -> bool:
    """A claim answered with no work (a dataloader's: wanted nothing)."""
    if not isinstance(message, p.Claim):
        return False
    return isinstance(reply, p.NoWork) or (isinstance(reply, p.Want) and reply.count <= 0)
