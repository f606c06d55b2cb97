"""A thread beside the worker's loop: it renews the leases the loop holds, and frees the
payloads the scheduler no longer refers to (Heartbeat, then Held → Drop).

Only the loop's own lease is renewed, so a lease whose reply never reached the worker runs
out instead of being kept alive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from asyncrl.transport import protocol as p
from asyncrl.transport.link import LinkClosed, LinkTimeout

from .data_plane import WorkerPayloads
from .version_tracking import describe_reply as _describe

__all__ = ["Heartbeats"]


class Heartbeats:
    """Beats every ``interval()`` seconds, naming the leases ``holding()`` returns;
    ``request(message, timeout_s)`` is one try on the worker's link.

    Both are asked at each beat: a lease being worked on changes all the time, and a
    worker that registered again takes the interval its new Ready names.
    """

    def __init__(
        self,
        name: str,
        request: Callable[[p.Message, float], p.Message],
        payloads: WorkerPayloads,
        *,
        request_timeout_s: float,
        interval: Callable[[], float],
        holding: Callable[[], tuple[int, ...]],
        log: Any,
    ) -> None:
        self.name = name
        self._request = request
        self.payloads = payloads
        self.request_timeout_s = request_timeout_s
        self._interval = interval
        self._holding = holding
        self._log = log
        self._done = threading.Event()  # the main loop has ended: the heartbeat thread ends
        self._beats: threading.Thread | None = None

    def start(self) -> None:
        self._beats = threading.Thread(target=self._heartbeats, name=f"{self.name}-heartbeat")
        self._beats.daemon = True
        self._beats.start()

    def stop(self, wait_s: float) -> None:
        """End the beats; a beat in flight to a gone scheduler is waited for ``wait_s`` at
        most."""
        self._done.set()
        if self._beats is not None:
            self._beats.join(wait_s)

    def _heartbeats(self) -> None:
        while not self._done.wait(self._interval()):
            self._beat()

    def _beat(self) -> None:
        # One try each: the next beat is the retry. The timeout is the long one: a link may
        # reconnect after a timeout, which could cost the main loop's reply in flight.
        # Registering again is the main loop's job (a forgotten worker's leases are gone
        # anyway), so two threads never race it.
        try:
            beat = p.Heartbeat(self.name, self._holding())
            reply = self._request(beat, self.request_timeout_s)
        except (LinkTimeout, LinkClosed):
            return
        if isinstance(reply, p.Error):
            self._log.warning("heartbeat refused", reply=_describe(reply))
            return
        self._free_payloads()

    def _free_payloads(self) -> None:
        """Ask which kept payloads the scheduler no longer refers to, and free them."""
        held = self.payloads.held(self.name)
        if held is None:
            return
        try:
            reply = self._request(held, self.request_timeout_s)
        except (LinkTimeout, LinkClosed):
            return
        if isinstance(reply, p.Drop):
            self.payloads.drop(reply.keys)
