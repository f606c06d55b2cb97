"""``ZmqLink``: a worker's SchedulerLink over a DEALER (requests) and a SUB (events).

ZeroMQ sockets are not thread-safe, so one I/O thread owns both and any thread may call the
link: a call encodes its message, hands it to the I/O thread through a mailbox (a queue
plus a pipe that wakes the thread's poller) and waits on a future. The I/O thread alone
decides each request's outcome: the reply with its req_id, LinkTimeout at its deadline, or
LinkClosed, so a reply and a timeout can never both win.

After a timeout the I/O thread follows the Lazy Pirate pattern: it closes the DEALER with
linger 0, so requests still queued for a hung or dead scheduler are thrown away rather
than delivered to its successor, and connects a fresh one under the same identity (the
scheduler's ROUTER_HANDOVER gives it the old route). A reply that comes for a request
nobody waits for any more goes to ``on_late_reply``, which runs on a thread of its own so
that it may call ``request`` (a worker gives back a lease it received too late).

Events arrive as ``[topic, *encode(event)]`` and wait in a bounded buffer that drops the
oldest when full: they are wake-ups, and a worker also polls.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import zmq

from .link import LinkClosed, LinkTimeout
from .protocol import Event, Message, ProtocolError, decode, encode, request_id
from .security import ClientKeys
from .sockets import connect_dealer, connect_worker_sockets

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "ZmqLink"]

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 2**20
# How long past its own deadline a caller waits before it stops trusting the I/O thread.
_STUCK_GRACE_S = 5.0
# Messages read from one socket before the loop looks at the others again.
_BATCH = 256


class ZmqLink:
    """A thread-safe SchedulerLink to a scheduler's ROUTER and PUB (see the module doc).

    ``on_late_reply`` gets each reply that matches no waiting request (it came after its
    request timed out), on a thread of its own. ``event_buffer`` bounds the events waiting
    for ``next_event``. Without a ``context`` the link makes one and terminates it on close.
    """

    def __init__(
        self,
        control_endpoint: str,
        events_endpoint: str,
        *,
        identity: str,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        client_keys: ClientKeys | None = None,
        on_late_reply: Callable[[Message], None] | None = None,
        context: zmq.Context | None = None,
        event_buffer: int = 10_000,
    ) -> None:
        self._owns_context = context is None
        self._context = zmq.Context() if context is None else context
        options = {
            "identity": identity,
            "max_message_bytes": max_message_bytes,
            "client_keys": client_keys,
        }
        try:
            sockets = connect_worker_sockets(
                self._context, control_endpoint, events_endpoint, **options
            )
        except BaseException:
            if self._owns_context:
                self._context.term()
            raise
        dial = functools.partial(connect_dealer, self._context, control_endpoint, **options)
        self._ids = itertools.count(1)
        self._ids_lock = threading.Lock()
        self._mailbox = _Mailbox()
        self._events = _EventBuffer(event_buffer)
        self._late = _LateReplies(on_late_reply)
        self._released = False
        self._release_lock = threading.Lock()
        io = _IoLoop(sockets.control, sockets.events, dial, self._mailbox, self._events, self._late)
        self._thread = threading.Thread(target=io.run, name=f"zmq-link-{identity}", daemon=True)
        self._thread.start()

    def request(self, message: Message, timeout_s: float) -> Message:
        """The scheduler's reply to ``message``; LinkTimeout after ``timeout_s``.

        Arrays in ``message`` are sent without a copy: do not change them until this returns.
        """
        with self._ids_lock:
            req_id = next(self._ids)
        call = _Call(req_id, encode(message, req_id), type(message).__name__, timeout_s)
        self._mailbox.put(call)
        try:
            return call.future.result(timeout_s + _STUCK_GRACE_S)
        except (LinkTimeout, LinkClosed):
            raise
        except TimeoutError:
            raise LinkTimeout(f"{call.what}: the link's I/O thread is not answering") from None

    def subscribe(self, prefixes: Sequence[str]) -> None:
        """Receive events whose topic starts with one of ``prefixes`` (adds to earlier ones)."""
        done: Future[None] = Future()
        self._mailbox.put(_Subscribe(tuple(p.encode() for p in prefixes), done))
        try:
            done.result(_STUCK_GRACE_S)
        except TimeoutError:
            raise LinkTimeout("subscribe: the link's I/O thread is not answering") from None

    def next_event(self, timeout_s: float) -> Event | None:
        """The oldest buffered event, or None after ``timeout_s``; LinkClosed once closed."""
        return self._events.get(timeout_s)

    @property
    def dropped_events(self) -> int:
        """Events thrown away because the buffer was full (the oldest go first)."""
        return self._events.dropped

    def close(self) -> None:
        """Stop the I/O thread, close the sockets, fail waiting calls with LinkClosed."""
        self._mailbox.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(_STUCK_GRACE_S)
        with self._release_lock:
            if self._released or self._thread.is_alive():
                # Still running: its sockets and pipe stay open rather than be pulled from
                # under it; the daemon thread ends with the process.
                return
            self._released = True
        self._mailbox.release()
        self._late.shutdown()
        if self._owns_context:
            self._context.term()

    def __enter__(self) -> ZmqLink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# --- what callers hand the I/O thread ---------------------------------------------------


@dataclass(eq=False)
class _Call:
    req_id: int
    frames: list[Any]
    what: str
    timeout_s: float
    deadline: float = field(init=False)
    future: Future[Message] = field(default_factory=Future)
    sent: bool = False

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s


@dataclass(frozen=True, eq=False)
class _Subscribe:
    prefixes: tuple[bytes, ...]
    done: Future[None]


class _Mailbox:
    """Commands from any thread to the I/O thread: a queue, and a pipe its poller watches."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Call | _Subscribe] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.closed = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def fileno(self) -> int:
        return self._read

    def put(self, command: _Call | _Subscribe) -> None:
        # Under the lock with the flag, so nothing is queued after the I/O thread's last look.
        with self._lock:
            if self.closed:
                raise LinkClosed("the link is closed")
            self._queue.put(command)
            self._wake()

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                self._wake()

    def take(self) -> list[_Call | _Subscribe]:
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

    def _wake(self) -> None:
        # A full pipe already holds enough wake-ups.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, b"\0")


class _EventBuffer:
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


class _LateReplies:
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


class _IoLoop:
    """Everything the I/O thread owns: both sockets, the calls in flight, the unsent ones."""

    def __init__(
        self,
        dealer: zmq.Socket,
        sub: zmq.Socket,
        dial: Callable[[], zmq.Socket],
        mailbox: _Mailbox,
        events: _EventBuffer,
        late: _LateReplies,
    ) -> None:
        self._dealer = dealer
        self._sub = sub
        self._dial = dial
        self._mailbox = mailbox
        self._events = events
        self._late = late
        self._pending: dict[int, _Call] = {}
        self._outbox: collections.deque[_Call] = collections.deque()
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
        # POLLOUT only while something waits to be sent: with IMMEDIATE it means "connected".
        self._poller.register(self._dealer, zmq.POLLIN | (zmq.POLLOUT if self._outbox else 0))
        ready = dict(self._poller.poll(self._poll_timeout_ms()))
        if self._mailbox.fileno() in ready:
            self._take_commands()
        if ready.get(self._dealer, 0) & zmq.POLLIN:
            self._receive_replies()
        if self._sub in ready:
            self._receive_events()
        self._send_outbox()
        self._expire()

    def _poll_timeout_ms(self) -> int | None:
        if not self._pending:
            return None
        soonest = min(call.deadline for call in self._pending.values())
        return max(0, math.ceil((soonest - time.monotonic()) * 1000))

    def _take_commands(self) -> None:
        for command in self._mailbox.take():
            if isinstance(command, _Call):
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
                self._dealer.send_multipart(call.frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return  # not connected (IMMEDIATE) or the queue is full: POLLOUT says when
            self._outbox.popleft()
            call.sent = True
            call.frames = []  # libzmq holds what it still needs

    def _receive_replies(self) -> None:
        for _ in range(_BATCH):
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            buffers = [frame.buffer for frame in frames]
            try:
                reply = decode(buffers)
            except ProtocolError as error:
                log.warning("dropped a reply that does not decode: %s", error)
                continue
            call = self._pending.pop(request_id(buffers), None)
            if call is None:
                self._late.deliver(reply)
            else:
                call.future.set_result(reply)

    def _receive_events(self) -> None:
        for _ in range(_BATCH):
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
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

    def _expire(self) -> None:
        now = time.monotonic()
        expired = [call for call in self._pending.values() if call.deadline <= now]
        for call in expired:
            del self._pending[call.req_id]
            if not call.sent:
                self._outbox.remove(call)
            call.future.set_exception(
                LinkTimeout(f"{call.what}: no reply from the scheduler in {call.timeout_s:g} s")
            )
        if expired:
            self._redial()

    def _redial(self) -> None:
        # Lazy Pirate: whatever the old socket still holds is dropped with it (linger 0).
        # Calls already sent stay pending: their replies reach the new socket by identity.
        self._poller.unregister(self._dealer)
        self._dealer.close(linger=0)
        self._dealer = self._dial()

    def _finish(self) -> None:
        self._mailbox.close()
        futures: list[Future[Any]] = [call.future for call in self._pending.values()]
        for command in self._mailbox.take():
            futures.append(command.future if isinstance(command, _Call) else command.done)
        for future in futures:
            future.set_exception(LinkClosed("the link was closed while the request waited"))
        self._pending.clear()
        self._outbox.clear()
        self._dealer.close(linger=0)
        self._sub.close(linger=0)
        self._events.close()
