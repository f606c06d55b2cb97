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

import functools
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import zmq

from ._link_io import (
    BATCH,
    STUCK_GRACE_S,
    Call,
    EventBuffer,
    IoLoop,
    LateReplies,
    Mailbox,
    Subscribe,
    Wire,
    no_reply,
)
from ._turn import Turn
from .identity import name_of
from .link import LinkClosed, LinkTimeout
from .protocol import Event, Message, ProtocolError, decode_with_id, encode
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
        self._mailbox = Mailbox()
        self._turn = Turn()
        self._wire = Wire(sockets.control, dial)
        self._events = EventBuffer(event_buffer)
        self._late = LateReplies(on_late_reply)
        self._released = False
        self._release_lock = threading.Lock()
        io = IoLoop(self._wire, sockets.events, self._turn, self._mailbox, self._events, self._late)
        # Named for the worker only: the routing id's tag is a credential (identity.py).
        thread_name = f"zmq-link-{name_of(identity.encode())}"
        self._thread = threading.Thread(target=io.run, name=thread_name, daemon=True)
        self._thread.start()

    def request(self, message: Message, timeout_s: float) -> Message:
        """The scheduler's reply to ``message``; LinkTimeout after ``timeout_s``.

        Arrays in ``message`` are sent without a copy: do not change them until this returns.
        """
        with self._ids_lock:
            req_id = next(self._ids)
        call = Call(req_id, encode(message, req_id), type(message).__name__, timeout_s)
        if self._turn.take_or_queue():
            return self._call_directly(call)
        call.future = Future()
        self._mailbox.put(call)
        try:
            return call.future.result(timeout_s + STUCK_GRACE_S)
        except (LinkTimeout, LinkClosed):
            raise
        except TimeoutError:
            raise LinkTimeout(f"{call.what}: the link's I/O thread is not answering") from None

    def subscribe(self, prefixes: Sequence[str]) -> None:
        """Receive events whose topic starts with one of ``prefixes`` (adds to earlier ones)."""
        done: Future[None] = Future()
        self._mailbox.put(Subscribe(tuple(p.encode() for p in prefixes), done))
        try:
            done.result(STUCK_GRACE_S)
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
            self._thread.join(STUCK_GRACE_S)
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

    def _call_directly(self, call: Call) -> Message:
        try:
            return self._exchange(call)
        finally:
            self._turn.give_back(self._mailbox.wake)

    def _exchange(self, call: Call) -> Message:
        wire = self._wire
        dealer = wire.dealer
        frames, call.frames = call.frames, []
        while True:
            if not call.sent:
                try:
                    wire.dropped()  # a drop before this send is not this call's
                    send_frames(dealer, frames, noblock=True)
                    self._turn.sending(call)
                except zmq.Again:
                    pass  # not connected (IMMEDIATE) or the queue is full: POLLOUT says when
            left_ms = math.ceil((call.deadline - time.monotonic()) * 1000)
            readable = dropped = False
            if left_ms > 0:
                flags = zmq.POLLIN if call.sent else zmq.POLLIN | zmq.POLLOUT
                items = [(dealer, flags), (self._turn.closed_fd, zmq.POLLIN)]
                if call.sent:
                    items.append((wire.monitor, zmq.POLLIN))
                spin = self._busy_poll_s if call.sent else 0.0
                ready = busy_poll(items, spin) or zmq.zmq_poll(items, left_ms)
                for which, events in ready:
                    readable = readable or (which is dealer and bool(events & zmq.POLLIN))
                    dropped = dropped or which is wire.monitor
            if self._turn.closed:
                raise LinkClosed("the link was closed while the request waited")
            if call.sent:
                reply = self._read_replies(dealer, call, readable)
                if reply is not None:
                    return reply
                if dropped and wire.dropped():
                    call.deadline = 0.0  # no reply comes over a closed connection (Wire)
            if time.monotonic() >= call.deadline:
                self._turn.expired(call)
                wire.redial()
                raise LinkTimeout(no_reply(call))

    def _read_replies(self, dealer: zmq.Socket, call: Call, polled: bool) -> Message | None:
        """Read what has come: ``call``'s reply, or late ones (delivered) before it.
        ``polled``: the poll just said the DEALER is readable."""
        for i in range(BATCH):
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
