"""What a worker holds to talk to the scheduler: one interface, two implementations.

``ZmqLink`` (transport/zmq_link.py) speaks to a scheduler process over a DEALER and a SUB
socket; ``InProcessHub.link()`` (tests/support/inprocess_hub.py, for the tests) calls a
scheduler living in the same process. Role code gets a link and never sees a socket.
Links are thread-safe: a worker's heartbeat thread and its main loop share one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .protocol import Event, Message

__all__ = ["LinkClosed", "LinkTimeout", "SchedulerLink"]


class LinkTimeout(TimeoutError):
    """No reply in time: the scheduler is down, restarting or unreachable."""


class LinkClosed(RuntimeError):
    """The link was closed while a request was waiting."""


class SchedulerLink(Protocol):
    def request(self, message: Message, timeout_s: float) -> Message:
        """Send ``message`` and return the scheduler's reply; LinkTimeout if none comes.

        After a timeout the request may or may not have reached the scheduler; a reply
        that comes later is not returned by any later call.
        """
        ...

    def subscribe(self, prefixes: Sequence[str]) -> None:
        """Receive events whose topic starts with one of ``prefixes`` (adds to earlier ones)."""
        ...

    def next_event(self, timeout_s: float) -> Event | None:
        """The next subscribed event, or None after ``timeout_s``. A wake-up, not data."""
        ...

    def close(self) -> None: ...
