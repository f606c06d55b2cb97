"""Who may use a link's DEALER right now: a calling thread, or the link's I/O thread.

ZeroMQ sockets are not thread-safe. ``ZmqLink`` lets a calling thread do its own socket
I/O when nothing else is in flight, and hands calls to its I/O thread otherwise; ``Turn``
is the small state machine that decides, under one lock, which of them holds the socket.
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Callable
from typing import Protocol

from .link import LinkClosed

__all__ = ["Sendable", "Turn"]


class Sendable(Protocol):
    """What the turn records on a call: whether it was sent, and after how many timeouts."""

    sent: bool
    timeouts_before: int


class _Holder(enum.Enum):
    NOBODY = enum.auto()
    CALLER = enum.auto()  # a calling thread, doing its own call
    IO = enum.auto()  # the link's I/O thread


class Turn:
    """Who may use the DEALER now, and what decides it (see zmq_link.py's module doc).

    The I/O thread holds the turn while it has calls (``io_calls``: queued, unsent or in
    flight) or while a late reply may still come; otherwise a calling thread may take it.
    Only the holder sends, so only the holder counts timeouts and replies (``sending``,
    ``expired``, ``answered``), which say whether a late reply may still come.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holder = _Holder.NOBODY
        self._io_calls = 0
        self._timeouts = 0  # calls that timed out after they were sent
        self._settled = 0  # timeouts after which a later call had its reply
        self.closed = False
        self.finished = False  # the I/O thread has closed the DEALER, or left it to a caller
        # Readable once the link is closed: wakes a caller polling the DEALER.
        self.closed_fd, self._closed_write = os.pipe()

    @property
    def _late_possible(self) -> bool:
        return self._settled < self._timeouts

    # --- callers

    def take_or_queue(self) -> bool:
        """True: the caller holds the turn. False: its call is counted for the I/O thread."""
        with self._cond:
            if self.closed:
                raise LinkClosed("the link is closed")
            if self._holder is _Holder.NOBODY and not self._io_calls and not self._late_possible:
                self._holder = _Holder.CALLER
                return True
            self._io_calls += 1
            return False

    def give_back(self, wake_io: Callable[[], None]) -> None:
        """From the calling thread that held the turn; calls ``wake_io`` if the I/O thread
        takes it, under the lock, so that the I/O thread cannot finish (and the link close
        the pipe ``wake_io`` writes to) in between."""
        with self._cond:
            busy = bool(self._io_calls) or self._late_possible
            self._holder = _Holder.IO if busy and not self.closed else _Holder.NOBODY
            if self._holder is _Holder.IO:
                wake_io()  # it has calls waiting, or must watch for a late reply
            self._cond.notify_all()

    # --- the holder

    def sending(self, call: Sendable) -> None:
        call.sent = True
        call.timeouts_before = self._timeouts

    def expired(self, call: Sendable) -> None:
        if call.sent:
            with self._cond:
                self._timeouts += 1

    def answered(self, call: Sendable) -> None:
        # Only the holder writes these two, so it may read them without the lock; it takes
        # it only to change _settled (other threads read _late_possible under it).
        if call.timeouts_before == self._timeouts and self._settled != self._timeouts:
            with self._cond:
                self._settled = self._timeouts  # sent after every timeout: nothing late left

    # --- the I/O thread

    def io_settle(self) -> bool:
        """Take the turn if the I/O thread needs it and it is free, or give it back if not;
        True while the I/O thread holds it."""
        with self._cond:
            needed = bool(self._io_calls) or self._late_possible
            if needed and self._holder is _Holder.NOBODY:
                self._holder = _Holder.IO
            elif not needed and self._holder is _Holder.IO:
                self._holder = _Holder.NOBODY
            return self._holder is _Holder.IO

    def io_done(self, calls: int) -> None:
        with self._cond:
            self._io_calls -= calls

    def io_final(self, wait_s: float) -> bool:
        """At the I/O thread's end: wait for a calling thread to give the turn back; True if
        the I/O thread may close the DEALER."""
        with self._cond:
            self._cond.wait_for(lambda: self._holder is not _Holder.CALLER, wait_s)
            if self._holder is _Holder.CALLER:
                return False
            self._holder = _Holder.IO  # for good: closed, so nobody takes it any more
            return True

    # --- closing

    def close(self) -> None:
        with self._cond:
            if self.closed:
                return
            self.closed = True
            os.write(self._closed_write, b"\0")  # once, into an empty pipe: never blocks
            self._cond.notify_all()

    def release(self) -> None:
        """Close the pipe once nobody can poll it any more (see ZmqLink.close)."""
        os.close(self.closed_fd)
        os.close(self._closed_write)
