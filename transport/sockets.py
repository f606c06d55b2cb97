"""Every socket of the bus, made in one place with every option chosen on purpose.

The scheduler binds a ROUTER (control) and a PUB (events); a worker connects a DEALER and
a SUB. The wire forms::

    control  DEALER sends  encode(request, req_id)
             ROUTER sees   [identity, *encode(request, req_id)]
             ROUTER sends  [identity, *encode(reply, req_id)]; the DEALER sees the frames
    events   PUB sends     [topic (utf-8), *encode(event)]; SUB filters on the topic prefix

Endpoints are ZeroMQ's: ``bind_scheduler_sockets`` takes a host and two ports (0 = any free
port) for TCP; ``bind_scheduler_sockets_at`` takes any two endpoints, ``ipc://`` ones
included (benchmarks, single-host runs). ``BoundSockets`` names the endpoints as workers
dial them.

With server keys both scheduler sockets are CURVE servers, and a ZAP authenticator lets in
only the listed client keys. Every failed handshake (wrong key, no keys, wrong server key)
is collected for the scheduler to log through ``BoundSockets.auth_failures()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

from ._handshakes import HANDSHAKE_FAILURES, ZAP_DOMAINS, CurveGuard, Refusals, read_monitor
from .security import ClientKeys, ServerKeys

__all__ = [
    "EVENTS_HWM",
    "AdaptiveSpin",
    "BoundSockets",
    "WorkerSockets",
    "bind_scheduler_sockets",
    "bind_scheduler_sockets_at",
    "busy_poll",
    "connect_dealer",
    "connect_subscriber",
    "connect_worker_sockets",
    "recv_waiting",
    "send_frames",
    "tcp_endpoint",
]

# The default HWM of 1000 silently drops a third of a fast burst (MEASUREMENTS.md). Events
# are small wake-ups, so a deep queue costs little and a drop stays rare.
EVENTS_HWM = 100_000
# Closing the scheduler's sockets waits this long to flush the last replies, never longer.
_SCHEDULER_LINGER_MS = 100
# The OS default waits two hours before probing an idle connection; a half-open one (a
# host that vanished, a NAT that forgot us) should be noticed within about a minute.
_KEEPALIVE_IDLE_S = 30
_KEEPALIVE_INTERVAL_S = 10
_KEEPALIVE_COUNT = 3
# pyzmq's send_multipart and recv_multipart spend more time in Python (a flag enum per frame,
# a getsockopt(RCVMORE) per frame, a zmq.Again built to say "nothing") than libzmq spends
# moving a small message; these helpers below take about half as long.
_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)


# --- the scheduler's side ---------------------------------------------------------------


@dataclass(eq=False)
class BoundSockets:
    """The scheduler's ROUTER and PUB, owned by the thread that uses them.

    ``monitors`` may be registered in that thread's poller: when one is readable,
    ``auth_failures()`` has something new.
    """

    control: zmq.Socket
    events: zmq.Socket
    control_endpoint: str
    events_endpoint: str
    monitors: tuple[zmq.Socket, zmq.Socket]
    _guard: CurveGuard | None = field(default=None, repr=False)
    refusals: Refusals = field(default_factory=Refusals, repr=False)

    def auth_failures(self) -> list[str]:
        """Lines about handshakes refused since the last call: the first few of each kind
        in an interval as they are, the rest summed up (see _handshakes.Refusals)."""
        for name, monitor in zip(("control", "events"), self.monitors, strict=True):
            read_monitor(name, monitor, self.refusals)
        return self.refusals.report()

    def close(self) -> None:
        """Close both sockets and their monitors, and stop the authenticator."""
        for socket, monitor in zip((self.control, self.events), self.monitors, strict=True):
            if not socket.closed:
                socket.disable_monitor()
            monitor.close(linger=0)
        self.control.close()
        self.events.close()
        if self._guard is not None:
            self._guard.stop()


def tcp_endpoint(host: str, port: int) -> str:
    """The TCP endpoint of ``host``:``port``; port 0 asks the OS for a free one."""
    address = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"tcp://{address}:{port if port else '*'}"


def bind_scheduler_sockets(
    ctx: zmq.Context,
    host: str,
    control_port: int,
    events_port: int,
    *,
    max_message_bytes: int,
    server_keys: ServerKeys | None = None,
    allowed_client_keys: Iterable[bytes] | None = None,
) -> BoundSockets:
    """Bind control and events on ``host`` over TCP (see ``bind_scheduler_sockets_at``)."""
    return bind_scheduler_sockets_at(
        ctx,
        tcp_endpoint(host, control_port),
        tcp_endpoint(host, events_port),
        max_message_bytes=max_message_bytes,
        server_keys=server_keys,
        allowed_client_keys=allowed_client_keys,
    )


def bind_scheduler_sockets_at(
    ctx: zmq.Context,
    control_endpoint: str,
    events_endpoint: str,
    *,
    max_message_bytes: int,
    server_keys: ServerKeys | None = None,
    allowed_client_keys: Iterable[bytes] | None = None,
) -> BoundSockets:
    """Bind the ROUTER at ``control_endpoint`` and the PUB at ``events_endpoint``.

    A frame larger than ``max_message_bytes`` makes libzmq drop the sender's connection
    (and whatever else was in flight on it); it never reaches the scheduler. libzmq checks
    each frame, not their sum: a bound on a whole message is the receiver's to check.

    With ``server_keys`` both sockets are CURVE servers admitting ``allowed_client_keys``
    (z85; ``server_keys.clients`` when None). One context holds one authenticator, so
    bind once per context at a time.
    """
    guard = None
    refusals = Refusals()
    if server_keys is not None:
        allowed = server_keys.clients if allowed_client_keys is None else allowed_client_keys
        # Started before binding: a client that connects first must meet the check too.
        guard = CurveGuard(ctx, frozenset(allowed), refusals)
    made: list[zmq.Socket] = []
    try:
        control = ctx.socket(zmq.ROUTER)
        made.append(control)
        _scheduler_options(control, max_message_bytes)
        # Unroutable replies (the worker is gone) are dropped, not raised in the loop.
        control.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # A restarted worker reconnects under the same identity and takes the route over.
        control.setsockopt(zmq.ROUTER_HANDOVER, 1)
        events = ctx.socket(zmq.PUB)
        made.append(events)
        _scheduler_options(events, max_message_bytes)
        events.setsockopt(zmq.SNDHWM, EVENTS_HWM)
        if server_keys is not None:
            _curve_server(control, server_keys, ZAP_DOMAINS["control"])
            _curve_server(events, server_keys, ZAP_DOMAINS["events"])
        monitors = tuple(s.get_monitor_socket(HANDSHAKE_FAILURES) for s in (control, events))
        made.extend(monitors)
        _bind(control, control_endpoint)
        _bind(events, events_endpoint)
    except BaseException:
        for socket in made:
            socket.close(linger=0)
        if guard is not None:
            guard.stop()
        raise
    return BoundSockets(
        control=control,
        events=events,
        control_endpoint=_last_endpoint(control),
        events_endpoint=_last_endpoint(events),
        monitors=monitors,
        _guard=guard,
        refusals=refusals,
    )


def _scheduler_options(socket: zmq.Socket, max_message_bytes: int) -> None:
    socket.setsockopt(zmq.LINGER, _SCHEDULER_LINGER_MS)
    socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    _keepalive(socket)


def _curve_server(socket: zmq.Socket, keys: ServerKeys, domain: bytes) -> None:
    socket.setsockopt(zmq.CURVE_SERVER, 1)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    socket.setsockopt(zmq.ZAP_DOMAIN, domain)  # tells the authenticator which socket asks


def _bind(socket: zmq.Socket, endpoint: str) -> None:
    if endpoint.startswith("tcp://["):
        socket.setsockopt(zmq.IPV6, 1)
    socket.bind(endpoint)


def _last_endpoint(socket: zmq.Socket) -> str:
    # The port the OS chose for a "*" bind, or the path of an ipc:// one.
    return socket.getsockopt(zmq.LAST_ENDPOINT).decode()


# --- a worker's side --------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class WorkerSockets:
    control: zmq.Socket
    events: zmq.Socket


def connect_worker_sockets(
    ctx: zmq.Context,
    control_endpoint: str,
    events_endpoint: str,
    *,
    identity: str,
    max_message_bytes: int,
    client_keys: ClientKeys | None = None,
) -> WorkerSockets:
    """A worker's DEALER and SUB (subscribed to nothing yet), connecting in the background."""
    control = connect_dealer(
        ctx,
        control_endpoint,
        identity=identity,
        max_message_bytes=max_message_bytes,
        client_keys=client_keys,
    )
    try:
        events = connect_subscriber(
            ctx, events_endpoint, max_message_bytes=max_message_bytes, client_keys=client_keys
        )
    except BaseException:
        control.close(linger=0)
        raise
    return WorkerSockets(control=control, events=events)


def connect_dealer(
    ctx: zmq.Context,
    endpoint: str,
    *,
    identity: str,
    max_message_bytes: int,
    client_keys: ClientKeys | None = None,
) -> zmq.Socket:
    """A DEALER to the scheduler's ROUTER, known there by ``identity``.

    IMMEDIATE: while no connection is up, a send does not queue (it would raise
    ``zmq.Again`` with NOBLOCK), so nothing waits in libzmq to reach a scheduler later.
    """
    socket = ctx.socket(zmq.DEALER)
    try:
        socket.setsockopt(zmq.IDENTITY, identity.encode())
        socket.setsockopt(zmq.IMMEDIATE, 1)
        socket.setsockopt(zmq.LINGER, 0)  # a request not sent by close is given up
        socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        _client_options(socket, endpoint, client_keys)
    except BaseException:
        socket.close(linger=0)
        raise
    return socket


def connect_subscriber(
    ctx: zmq.Context,
    endpoint: str,
    *,
    max_message_bytes: int,
    client_keys: ClientKeys | None = None,
) -> zmq.Socket:
    """A SUB to the scheduler's PUB, with no subscription yet."""
    socket = ctx.socket(zmq.SUB)
    try:
        socket.setsockopt(zmq.RCVHWM, EVENTS_HWM)  # see EVENTS_HWM
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        _client_options(socket, endpoint, client_keys)
    except BaseException:
        socket.close(linger=0)
        raise
    return socket


def _client_options(socket: zmq.Socket, endpoint: str, keys: ClientKeys | None) -> None:
    _keepalive(socket)
    if keys is not None:
        socket.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
        socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    if endpoint.startswith("tcp://["):
        socket.setsockopt(zmq.IPV6, 1)
    socket.connect(endpoint)


def _keepalive(socket: zmq.Socket) -> None:
    socket.setsockopt(zmq.TCP_KEEPALIVE, 1)
    socket.setsockopt(zmq.TCP_KEEPALIVE_IDLE, _KEEPALIVE_IDLE_S)
    socket.setsockopt(zmq.TCP_KEEPALIVE_INTVL, _KEEPALIVE_INTERVAL_S)
    socket.setsockopt(zmq.TCP_KEEPALIVE_CNT, _KEEPALIVE_COUNT)


# --- moving frames ----------------------------------------------------------------------


def send_frames(socket: zmq.Socket, frames: Sequence[Any], *, noblock: bool = False) -> None:
    """Send ``frames`` as one message, as ``send_multipart(frames, copy=False)`` does.

    With ``noblock`` only the first frame may raise ``zmq.Again`` (nothing is sent then):
    libzmq checks its high-water mark when a message starts, never in the middle.
    """
    flags = _NOBLOCK if noblock else 0
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        socket.send(frame, (flags | _SNDMORE) if i < last else flags, copy=False)


def recv_waiting(socket: zmq.Socket, *, polled: bool = False) -> list[zmq.Frame] | None:
    """The next message's frames if one is waiting (never blocks), else None.

    ``polled``: a poll just reported POLLIN on ``socket``, so asking its EVENTS first (a
    getsockopt, as long as the recv of a small frame) is skipped.
    """
    if not polled and not socket.getsockopt(zmq.EVENTS) & _POLLIN:
        return None
    try:
        frame = socket.recv(_NOBLOCK, copy=False)
    except zmq.Again:  # EVENTS said so, but stay safe
        return None
    frames = [frame]
    while frame.more:  # the rest of a message arrives with its first frame
        frame = socket.recv(0, copy=False)
        frames.append(frame)
    return frames


def busy_poll(items: list[tuple[Any, int]], spin_s: float) -> list[tuple[Any, int]]:
    """``zmq_poll(items)`` that answers without sleeping: polls again and again, for at most
    ``spin_s``; [] if nothing became ready in that time (then block in an ordinary poll).

    Why: on a virtual machine a thread that sleeps in poll takes 0.1-0.5 ms to be woken
    (the idle vCPU halts and needs an interrupt), more than a whole round trip over the bus
    (MEASUREMENTS.md: REQ/REP p50 ~0.15 ms). Spinning for a short while, right when a reply
    or the next request is due, keeps that core awake; it costs the CPU it spins.
    """
    if spin_s <= 0:
        return []
    deadline = time.perf_counter() + spin_s
    poll = zmq.zmq_poll
    while True:
        ready = poll(items, 0)
        if ready or time.perf_counter() >= deadline:
            return ready


class AdaptiveSpin:
    """How long to busy-poll after serving: ``spin_s`` while the next request has lately
    come within that time, nothing while it mostly has not.

    A spin that times out is a core burnt for nothing, and on a host whose cores are shared
    with the workers it is taken from them: with requests far apart (large payloads, slow
    steps) the scheduler should sleep. Every gap between one turn's serving and the next
    request is recorded, spun or not, so spinning resumes as soon as requests come close
    together again.
    """

    def __init__(self, spin_s: float, *, memory: float = 0.9, threshold: float = 0.25) -> None:
        self.spin_s = spin_s
        self.memory = memory  # weight of the past in the running rate of caught requests
        self.threshold = threshold  # spin while at least this share would have been caught
        self.caught_rate = 1.0

    def next_spin_s(self) -> float:
        return self.spin_s if self.caught_rate >= self.threshold else 0.0

    def record(self, gap_s: float) -> None:
        """The next request came ``gap_s`` after the last turn's serving."""
        caught = 1.0 if gap_s <= self.spin_s else 0.0
        self.caught_rate = self.memory * self.caught_rate + (1 - self.memory) * caught
