"""``ZmqLink``: a worker's SchedulerLink over a DEALER (requests) and a SUB (events).

ZeroMQ sockets are not thread-safe, so one thread at a time may use the DEALER: the one
that holds the link's *turn* (``Turn`` in _turn.py). A call made while no other call is in flight
takes the turn and does its own I/O: it sends, polls the DEALER until its reply or its
deadline, and gives the turn back. That is the common case (a worker's loop; its
heartbeat thread rarely overlaps it), and it costs no thread hand-off. Handing every call
to an I/O thread and back costs two thread wake-ups per request: about 0.15 ms on a 2-core
VM, as much again as the socket round trip itself.

A call made while another is in flight goes to the link's I/O thread instead, through a
mailbox (a queue plus a pipe that wakes the thread's poller), and waits on a future; the
I/O thread takes the turn as soon as it is free and keeps it while it has calls. Whoever
holds the turn alone decides the outcome of the calls it sent: the reply with its req_id,
LinkTimeout at its deadline, or LinkClosed, so a reply and a timeout can never both win.

After a timeout the link follows the Lazy Pirate pattern: it closes the DEALER with linger
0, so requests still queued for a hung or dead scheduler are thrown away rather than
delivered to its successor, and connects a fresh one under the same identity (the
scheduler's ROUTER_HANDOVER gives it the old route). A reply that comes for a request
nobody waits for any more goes to ``on_late_reply``, which runs on a thread of its own so
that it may call ``request`` (a worker gives back a lease it received too late). Replies
come in order, so once a request sent after the last timeout has its reply, no late one is
still on its way; until then the I/O thread holds the turn whenever no call does, and
watches the DEALER, so that a late reply is not left waiting for the next request.

The I/O thread alone owns the SUB. Events arrive as ``[topic, *encode(event)]`` and wait
in a bounded buffer that drops the oldest when full: they are wake-ups, and a worker also
polls.
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

from ._turn import Turn
from .link import LinkClosed, LinkTimeout
from .protocol import Event, Message, ProtocolError, decode, decode_with_id, encode
from .security import ClientKeys
from .sockets import (
    busy_poll,
    connect_dealer,
    connect_worker_sockets,
    recv_waiting,
    send_frames,
)

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
    ``busy_poll_s``: how long a caller doing its own call checks for its reply without
    sleeping before it sleeps in poll (see sockets.busy_poll); 0 sleeps at once.
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
        busy_poll_s: float = 0.0,
    ) -> None:
        self._busy_poll_s = busy_poll_s
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
        self._turn = Turn()
        self._wire = _Wire(sockets.control, dial)
        self._events = _EventBuffer(event_buffer)
        self._late = _LateReplies(on_late_reply)
        self._released = False
        self._release_lock = threading.Lock()
        io = _IoLoop(
            self._wire, sockets.events, self._turn, self._mailbox, self._events, self._late
        )
        self._thread = threading.Thread(target=io.run, name=f"zmq-link-{identity}", daemon=True)
        self._thread.start()

    def request(self, message: Message, timeout_s: float) -> Message:
        """The scheduler's reply to ``message``; LinkTimeout after ``timeout_s``.

        Arrays in ``message`` are sent without a copy: do not change them until this returns.
        """
        with self._ids_lock:
            req_id = next(self._ids)
        call = _Call(req_id, encode(message, req_id), type(message).__name__, timeout_s)
        if self._turn.take_or_queue():
            return self._call_directly(call)
        call.future = Future()
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
        self._turn.close()
        self._mailbox.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(_STUCK_GRACE_S)
        with self._release_lock:
            if self._released or self._thread.is_alive() or not self._turn.finished:
                # Still running: its sockets and pipes stay open rather than be pulled from
                # under it; the daemon thread ends with the process.
                return
            self._released = True
        self._mailbox.release()
        self._turn.release()
        self._late.shutdown()
        if self._owns_context:
            self._context.term()

    def __enter__(self) -> ZmqLink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- a call made on the caller's thread, which holds the turn ------------------------

    def _call_directly(self, call: _Call) -> Message:
        try:
            return self._exchange(call)
        finally:
            self._turn.give_back(self._mailbox.wake)

    def _exchange(self, call: _Call) -> Message:
        dealer = self._wire.dealer
        frames, call.frames = call.frames, []
        while True:
            if not call.sent:
                try:
                    send_frames(dealer, frames, noblock=True)
                    self._turn.sending(call)
                except zmq.Again:
                    pass  # not connected (IMMEDIATE) or the queue is full: POLLOUT says when
            left_ms = math.ceil((call.deadline - time.monotonic()) * 1000)
            readable = False
            if left_ms > 0:
                flags = zmq.POLLIN if call.sent else zmq.POLLIN | zmq.POLLOUT
                items = [(dealer, flags), (self._turn.closed_fd, zmq.POLLIN)]
                spin = self._busy_poll_s if call.sent else 0.0
                ready = busy_poll(items, spin) or zmq.zmq_poll(items, left_ms)
                for which, events in ready:
                    readable = readable or (which is dealer and bool(events & zmq.POLLIN))
            if self._turn.closed:
                raise LinkClosed("the link was closed while the request waited")
            if call.sent:
                reply = self._read_replies(dealer, call, readable)
                if reply is not None:
                    return reply
            if time.monotonic() >= call.deadline:
                self._turn.expired(call)
                self._wire.redial()
                raise LinkTimeout(
                    f"{call.what}: no reply from the scheduler in {call.timeout_s:g} s"
                )

    def _read_replies(self, dealer: zmq.Socket, call: _Call, polled: bool) -> Message | None:
        """Read what has come: ``call``'s reply, or late ones (delivered) before it.
        ``polled``: the poll just said the DEALER is readable."""
        for i in range(_BATCH):
            frames = recv_waiting(dealer, polled=polled and i == 0)
            if frames is None:
                return None
            try:
                reply, req_id = decode_with_id([frame.buffer for frame in frames])
            except ProtocolError as error:
                log.warning("dropped a reply that does not decode: %s", error)
                continue
            if req_id == call.req_id:
                self._turn.answered(call)
                return reply
            self._late.deliver(reply)
        return None


class _Wire:
    """The DEALER, replaced by a fresh one after a timeout; used only by the turn's holder."""

    def __init__(self, dealer: zmq.Socket, dial: Callable[[], zmq.Socket]) -> None:
        self.dealer = dealer
        self._dial = dial

    def redial(self) -> None:
        # Lazy Pirate: whatever the old socket still holds is dropped with it (linger 0).
        # Calls already sent stay pending: their replies reach the new socket by identity.
        self.dealer.close(linger=0)
        self.dealer = self._dial()


# --- what callers hand the I/O thread ---------------------------------------------------


@dataclass(eq=False)
class _Call:
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
            self.wake()

    def close(self) -> None:
        with self._lock:
            if not self.closed:
                self.closed = True
                self.wake()

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

    def wake(self) -> None:
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
    """Everything the I/O thread owns: the SUB, the calls handed to it, and the DEALER
    while it holds the turn."""

    def __init__(
        self,
        wire: _Wire,
        sub: zmq.Socket,
        turn: Turn,
        mailbox: _Mailbox,
        events: _EventBuffer,
        late: _LateReplies,
    ) -> None:
        self._wire = wire
        self._sub = sub
        self._turn = turn
        self._mailbox = mailbox
        self._events = events
        self._late = late
        self._pending: dict[int, _Call] = {}
        self._outbox: collections.deque[_Call] = collections.deque()
        self._watched: zmq.Socket | None = None  # the DEALER, while in the poller
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
        if holds and self._watched is not None and ready.get(self._watched, 0) & zmq.POLLIN:
            self._receive_replies()
        if self._sub in ready:
            self._receive_events()
        if holds:
            self._send_outbox()
        self._expire(holds)

    def _watch(self, holds: bool) -> None:
        """Poll the DEALER while the turn is held; POLLOUT only while something waits to be
        sent (with IMMEDIATE it means "connected")."""
        if self._watched is not None and (not holds or self._watched is not self._wire.dealer):
            # Not ours any more, or closed by a caller's redial (a closed socket may not be
            # unregistered; the poller holds it by reference only).
            with contextlib.suppress(zmq.ZMQError, KeyError):
                self._poller.unregister(self._watched)
            self._watched = None
        if holds:
            self._watched = self._wire.dealer
            flags = zmq.POLLIN | (zmq.POLLOUT if self._outbox else 0)
            self._poller.register(self._watched, flags)

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
                send_frames(self._wire.dealer, call.frames, noblock=True)
            except zmq.Again:
                return  # not connected (IMMEDIATE) or the queue is full: POLLOUT says when
            self._outbox.popleft()
            self._turn.sending(call)
            call.frames = []  # libzmq holds what it still needs

    def _receive_replies(self) -> None:
        for _ in range(_BATCH):
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
        for _ in range(_BATCH):
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

    def _expire(self, holds: bool) -> None:
        now = time.monotonic()
        expired = [call for call in self._pending.values() if call.deadline <= now]
        for call in expired:
            del self._pending[call.req_id]
            if not call.sent:
                self._outbox.remove(call)
            self._turn.expired(call)
            call.future.set_exception(
                LinkTimeout(f"{call.what}: no reply from the scheduler in {call.timeout_s:g} s")
            )
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
            futures.append(command.future if isinstance(command, _Call) else command.done)
        for future in futures:
            future.set_exception(LinkClosed("the link was closed while the request waited"))
        self._pending.clear()
        self._outbox.clear()
        self._watch(False)
        if self._turn.io_final(_STUCK_GRACE_S):
            self._wire.dealer.close(linger=0)
            self._turn.finished = True
        self._sub.close(linger=0)
        self._events.close()
