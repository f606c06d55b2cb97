"""What a :class:`~.zmq_link.ZmqLink` runs on its I/O thread, and the small thread-safe
pieces between that thread and the link's callers: the DEALER that a timeout replaces,
the calls and subscriptions handed over through a mailbox, the buffer events wait in, and
the thread late replies are delivered on. See :mod:`.zmq_link` for the protocol.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import zmq

from ._turn import Turn
from .link import LinkClosed, LinkTimeout
from .protocol import Event, Message, ProtocolError, decode, decode_with_id
from .sockets import recv_waiting, send_frames

__all__ = [
    "BATCH",
    "STUCK_GRACE_S",
    "Call",
    "EventBuffer",
    "IoLoop",
    "LateReplies",
    "Mailbox",
    "Subscribe",
    "Wire",
    "no_reply",
]

# The link's own logger: what its I/O thread logs reads as the link's.
log = logging.getLogger("asyncrl.transport.zmq_link")

# How long past its own deadline a caller waits before it stops trusting the I/O thread.
STUCK_GRACE_S = 5.0
# Messages read from one socket before the loop looks at the others again.
BATCH = 256


class Wire:
    """The DEALER, replaced by a fresh one after a timeout; used only by the turn's holder.

    ``monitor`` is readable when the DEALER's connection closed (``dropped`` says so): a
    scheduler that was killed answers nothing sent to it, and its successor is up in a
    second or two, so a call in flight gives up then instead of at its deadline (seconds
    later), and is sent again to the new scheduler as after a timeout.
    """

    def __init__(self, dealer: zmq.Socket, dial: Callable[[], zmq.Socket]) -> None:
        self.dealer = dealer
        self._dial = dial
        self.monitor = _disconnections(dealer)

    def redial(self) -> None:
        # Lazy Pirate: whatever the old socket still holds is dropped with it (linger 0).
        # Calls already sent stay pending: their replies reach the new socket by identity.
        self.close()
        self.dealer = self._dial()
        self.monitor = _disconnections(self.dealer)

    def dropped(self) -> bool:
        """Whether the DEALER's connection closed since the last look."""
        dropped = False
        while recv_waiting(self.monitor) is not None:
            dropped = True  # the monitor reports disconnections only
        return dropped

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.dealer.disable_monitor()
        self.monitor.close(linger=0)
        self.dealer.close(linger=0)


def _disconnections(dealer: zmq.Socket) -> zmq.Socket:
    return dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED)


# --- what callers hand the I/O thread ---------------------------------------------------


@dataclass(eq=False)
class Call:
    req_id: int
    frames: list[Any]
    what: str
    timeout_s: float
    deadline: float = field(init=False)
    future: Future[Message] = field(init=False)  # only for calls handed to the I/O thread
    sent: bool = False
    timeouts_before: int = 0  # the link's timeouts when this call was sent

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s


@dataclass(frozen=True, eq=False)
class Subscribe:
    prefixes: tuple[bytes, ...]
    done: Future[None]


class Mailbox:
    """Commands from any thread to the I/O thread: a queue, and a pipe its poller watches."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Call | Subscribe] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.closed = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def fileno(self) -> int:
        return self._read

    def put(self, command: Call | Subscribe) -> None:
        # Under the lock with the flag, so nothing is queued after the I/O thread's last look.
        with self._lock:
            if self.closed:
                raise LinkClosed("the link is closed")
            self._queue.put(command)
            self.wake()

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                self.wake()

    def take(self) -> list[Call | Subscribe]:
        """Everything queued so far, and the wake-ups that announced it."""
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass
        taken = []
        while True:
            try:
                taken.append(self._queue.get_nowait())
            except queue.Empty:
                return taken

    def release(self) -> None:
        os.close(self._read)
        os.close(self._write)

    def wake(self) -> None:
        # A full pipe already holds enough wake-ups.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"\0")


class EventBuffer:
    """Events waiting for ``next_event``; when full, the oldest is dropped and counted."""

    def __init__(self, size: int) -> None:
        self._items: collections.deque[Event] = collections.deque(maxlen=size)
        self._ready = threading.Condition()
        self._closed = False
        self.dropped = 0

    def put(self, event: Event) -> None:
        with self._ready:
            if len(self._items) == self._items.maxlen:
                self.dropped += 1
            self._items.append(event)
            self._ready.notify()

    def get(self, timeout_s: float) -> Event | None:
        with self._ready:
            self._ready.wait_for(lambda: self._items or self._closed, max(timeout_s, 0.0))
            if self._closed:
                raise LinkClosed("the link is closed")
            return self._items.popleft() if self._items else None

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()


class LateReplies:
    """Runs ``on_late_reply`` off the I/O thread, one reply at a time, in arrival order."""

    def __init__(self, callback: Callable[[Message], None] | None) -> None:
        self._callback = callback
        self._executor = (
            None if callback is None else ThreadPoolExecutor(1, thread_name_prefix="zmq-link-late")
        )

    def deliver(self, message: Message) -> None:
        if self._executor is None:
            log.info("dropped a %s that came after its request timed out", type(message).__name__)
            return
        # Refused once shut down: the link is closing and nobody wants the reply any more.
        with contextlib.suppress(RuntimeError):
            self._executor.submit(self._run, message)

    def _run(self, message: Message) -> None:
        assert self._callback is not None
        try:
            self._callback(message)
        except Exception:
            log.exception("on_late_reply failed for a %s", type(message).__name__)

    def shutdown(self) -> None:
        if self._executor is not None:
            # No wait: close() may be called from the callback itself.
            self._executor.shutdown(wait=False, cancel_futures=True)


# --- the I/O thread ---------------------------------------------------------------------


class IoLoop:
    """Everything the I/O thread owns: the SUB, the calls handed to it, and the DEALER
    while it holds the turn."""

    def __init__(
        self,
        wire: Wire,
        sub: zmq.Socket,
        turn: Turn,
        mailbox: Mailbox,
        events: EventBuffer,
        late: LateReplies,
    ) -> None:
        self._wire = wire
        self._sub = sub
        self._turn = turn
        self._mailbox = mailbox
        self._events = events
        self._late = late
        self._pending: dict[int, Call] = {}
        self._outbox: collections.deque[Call] = collections.deque()
        self._watched: tuple[zmq.Socket, zmq.Socket] | None = None  # DEALER and monitor
        self._poller = zmq.Poller()
        self._poller.register(self._sub, zmq.POLLIN)
        self._poller.register(mailbox.fileno(), zmq.POLLIN)

    def run(self) -> None:
        try:
            while not self._mailbox.closed:
                self._step()
        except Exception:
            log.exception("the link's I/O thread failed; the link is closed")
        finally:
            self._finish()

    def _step(self) -> None:
        self._watch(self._turn.io_settle())
        ready = dict(self._poller.poll(self._poll_timeout_ms()))
        if self._mailbox.fileno() in ready:
            self._take_commands()
        holds = self._turn.io_settle()
        watched = self._watched if holds else None
        if watched is not None and ready.get(watched[0], 0) & zmq.POLLIN:
            self._receive_replies()
        # Read before sending: a drop noticed now is of the connection the sent calls took.
        dropped = watched is not None and watched[1] in ready and self._wire.dropped()
        if self._sub in ready:
            self._receive_events()
        if dropped:
            self._give_up_sent()
        if holds:
            self._send_outbox()
        self._expire(holds)

    def _watch(self, holds: bool) -> None:
        """Poll the DEALER and its monitor while the turn is held; POLLOUT only while
        something waits to be sent (with IMMEDIATE it means "connected")."""
        if self._watched is not None and (not holds or self._watched[0] is not self._wire.dealer):
            # Not ours any more, or closed by a caller's redial (a closed socket may not be
            # unregistered; the poller holds it by reference only).
            for socket in self._watched:
                with contextlib.suppress(zmq.ZMQError, KeyError):
                    self._poller.unregister(socket)
            self._watched = None
        if holds:
            self._watched = (self._wire.dealer, self._wire.monitor)
            flags = zmq.POLLIN | (zmq.POLLOUT if self._outbox else 0)
            self._poller.register(self._wire.dealer, flags)
            self._poller.register(self._wire.monitor, zmq.POLLIN)

    def _poll_timeout_ms(self) -> int | None:
        if not self._pending:
            return None
        soonest = min(call.deadline for call in self._pending.values())
        return max(0, math.ceil((soonest - time.monotonic()) * 1000))

    def _take_commands(self) -> None:
        for command in self._mailbox.take():
            if isinstance(command, Call):
                self._pending[command.req_id] = command
                self._outbox.append(command)
            else:
                for prefix in command.prefixes:
                    self._sub.setsockopt(zmq.SUBSCRIBE, prefix)
                command.done.set_result(None)

    def _send_outbox(self) -> None:
        while self._outbox:
            call = self._outbox[0]
            try:
                send_frames(self._wire.dealer, call.frames, noblock=True)
            except zmq.Again:
                return  # not connected (IMMEDIATE) or the queue is full: POLLOUT says when
            self._outbox.popleft()
            self._turn.sending(call)
            call.frames = []  # libzmq holds what it still needs

    def _receive_replies(self) -> None:
        for _ in range(BATCH):
            frames = recv_waiting(self._wire.dealer)
            if frames is None:
                return
            try:
                reply, req_id = decode_with_id([frame.buffer for frame in frames])
            except ProtocolError as error:
                log.warning("dropped a reply that does not decode: %s", error)
                continue
            call = self._pending.pop(req_id, None)
            if call is None:
                self._late.deliver(reply)
            else:
                self._turn.answered(call)
                self._turn.io_done(1)
                call.future.set_result(reply)

    def _receive_events(self) -> None:
        for _ in range(BATCH):
            frames = recv_waiting(self._sub)
            if frames is None:
                return
            try:
                event = decode([frame.buffer for frame in frames[1:]])
            except ProtocolError as error:
                log.warning("dropped an event that does not decode: %s", error)
                continue
            if isinstance(event, Event):
                self._events.put(event)
            else:
                log.warning("dropped a %s published as an event", type(event).__name__)

    def _give_up_sent(self) -> None:
        """The connection closed: what was sent on it gets no reply (see Wire)."""
        for call in [call for call in self._pending.values() if call.sent]:
            call.deadline = 0.0  # _expire ends it now, as a timeout

    def _expire(self, holds: bool) -> None:
        now = time.monotonic()
        expired = [call for call in self._pending.values() if call.deadline <= now]
        for call in expired:
            del self._pending[call.req_id]
            if not call.sent:
                self._outbox.remove(call)
            self._turn.expired(call)
            call.future.set_exception(LinkTimeout(no_reply(call)))
        if expired:
            self._turn.io_done(len(expired))
            # Without the turn only unsent calls can expire here (sent ones were sent by
            # this thread, which keeps the turn until they are decided): nothing to drop.
            if holds:
                self._watch(False)
                self._wire.redial()

    def _finish(self) -> None:
        self._mailbox.close()
        self._turn.close()
        futures: list[Future[Any]] = [call.future for call in self._pending.values()]
        for command in self._mailbox.take():
            futures.append(command.future if isinstance(command, Call) else command.done)
        for future in futures:
            future.set_exception(LinkClosed("the link was closed while the request waited"))
        self._pending.clear()
        self._outbox.clear()
        self._watch(False)
        if self._turn.io_final(STUCK_GRACE_S):
            self._wire.close()
            self._turn.finished = True
        self._sub.close(linger=0)
        self._events.close()


def no_reply(call: Call) -> str:
    """Why ``call`` ended without a reply: its deadline passed, or its connection closed."""
    if call.deadline == 0.0:
        return f"{call.what}: the connection to the scheduler closed before the reply"
    return f"{call.what}: no reply from the scheduler in {call.timeout_s:g} s"
