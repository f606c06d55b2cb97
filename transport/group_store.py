"""The key-value store a group of ranks meets through: ``torch.distributed``'s rendezvous
(where gloo's and NCCL's connections are) and the leader's orders to its followers.

torch's ``TCPStore`` listens on every interface whatever host it is given and serves
whoever connects: a client on the machine's network address read a leader's orders and
planted one that its followers then carried out. This store is served by the leader on
exactly the address the group meets at (127.0.0.1 for a group on one machine, so nothing
off the machine reaches it) over ZeroMQ with CURVE. Both key pairs derive from the run
secret and the server lets in only the client key, so a peer without the secret neither
reads (the traffic is encrypted) nor writes (it is refused at the handshake), whether it
sits on another machine or is another user of this one. What the store holds is
bounded (one value, all values, the number of keys): a request past a bound gets an
error reply and the store serves on.

Wire: one msgpack frame each way; a request is ``[id, op, *args]``, a reply
``[id, status, value]``. ``get`` and ``wait`` wait at the server (up to the timeout the
request carries) for their keys to be set, so a waiting rank costs no polling.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import itertools
import socket
import threading
import time
from dataclasses import dataclass, field

import msgpack
import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

__all__ = [
    "GroupStoreClient",
    "GroupStoreError",
    "GroupStoreServer",
    "Limits",
    "StoreGone",
    "StoreRefused",
    "StoreTimeout",
    "Table",
]

_ZAP_DOMAIN = "asyncrl.group"
_OK, _ERROR, _TIMEOUT = 0, 1, 2
_IDLE_POLL_MS = 100  # how soon the server's loop notices it is stopped
_LONGEST_WAIT_S = 86_400.0
_HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class GroupStoreError(RuntimeError):
    """The group's store refused a request or cannot be reached."""


class StoreTimeout(GroupStoreError):
    """Keys waited for were not set in time."""


class StoreGone(GroupStoreError):
    """The store's server closed the connection (the leader is gone), or never answered."""


class StoreRefused(GroupStoreError):
    """The server refused this client's key: it does not hold the same run secret."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What the store holds at most. Orders are leases (bounded by the bus's message size,
    ``scheduler.max_message_mb``) and the leader deletes each once every follower read it;
    the rendezvous adds a few short keys per rank and subgroup."""

    value_bytes: int = 64 << 20
    total_bytes: int = 256 << 20
    keys: int = 65_536

    @classmethod
    def for_messages(cls, message_bytes: int) -> Limits:
        """Room for orders that carry bus messages of ``message_bytes``: two orders live at
        a time, and some room for the rendezvous."""
        value = message_bytes + (1 << 20)
        return cls(value_bytes=value, total_bytes=4 * value + (64 << 20))


def _curve_pair(secret: bytes, role: bytes) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys for ``role``, derived from the run secret."""
    seed = hmac.new(secret, b"asyncrl group store\0" + role, hashlib.sha256).digest()
    private = z85.encode(seed)
    return zmq.curve_public(private), private


def _endpoint(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _bind_address(host: str) -> str:
    """The address ``host`` names, as ZeroMQ binds it (it binds interfaces and addresses,
    not names)."""
    name = host.strip("[]")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    # IPv4 first: a client dialling a name resolves it as ZeroMQ does without its IPv6
    # option, to an IPv4 address.
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror:
        return socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0]


@dataclass
class _Waiter:
    peer: bytes
    request: int
    keys: list[str]
    deadline: float
    value: bool  # a get: the reply carries the key's value


@dataclass
class Table:
    """The store's keys and values, with its bounds; no sockets, no clock of its own."""

    limits: Limits = field(default_factory=Limits)
    values: dict[str, bytes] = field(default_factory=dict)
    size: int = 0

    def set(self, key: str, value: bytes) -> None:
        if len(value) > self.limits.value_bytes:
            raise GroupStoreError(
                f"a value of {len(value)} bytes for {key[:100]!r}: the group's store takes "
                f"{self.limits.value_bytes} at most"
            )
        old = self.values.get(key)
        grown = self.size + len(key) + len(value) - (0 if old is None else len(key) + len(old))
        if old is None and len(self.values) >= self.limits.keys:
            raise GroupStoreError(f"the group's store holds {self.limits.keys} keys at most")
        if grown > self.limits.total_bytes:
            raise GroupStoreError(
                f"the group's store holds {self.limits.total_bytes} bytes at most "
                f"({self.size} held, {key[:100]!r} asks for {len(value)} more)"
            )
        self.values[key] = value
        self.size = grown

    def add(self, key: str, amount: int) -> int:
        # A counter is its decimal text, as torch's stores keep it (ranks may get it).
        try:
            now = int(self.values.get(key, b"0")) + amount
        except ValueError:
            raise GroupStoreError(f"{key[:100]!r} holds no integer to add to") from None
        self.set(key, str(now).encode())
        return now

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        current = self.values.get(key)
        if (current is None and not expected) or current == expected:
            self.set(key, desired)
            return desired
        return expected if current is None else current

    def delete(self, key: str) -> bool:
        old = self.values.pop(key, None)
        if old is not None:
            self.size -= len(key) + len(old)
        return old is not None

    def has(self, keys: list[str]) -> bool:
        return all(key in self.values for key in keys)


class GroupStoreServer:
    """The leader's side: serves a :class:`Table` on ``host:port`` from a thread of its own."""

    def __init__(self, host: str, port: int, secret: bytes, limits: Limits | None = None):
        server_public, server_secret = _curve_pair(secret, b"server")
        self._client_public = _curve_pair(secret, b"client")[0]
        self.table = Table(limits or Limits())
        self.refused = 0  # handshakes with another key: no log line each (they can flood)
        self._context = zmq.Context()
        self._auth = ThreadAuthenticator(self._context)
        self._auth.start()
        self._auth.configure_curve_callback(_ZAP_DOMAIN, credentials_provider=self)
        self._socket = self._context.socket(zmq.ROUTER)
        s = self._socket
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, self.table.limits.value_bytes + (1 << 20))
        s.setsockopt(zmq.CURVE_SERVER, 1)
        s.setsockopt(zmq.CURVE_PUBLICKEY, server_public)
        s.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
        s.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN.encode())
        address = _bind_address(host)
        s.setsockopt(zmq.IPV6, ":" in address)
        try:
            s.bind(_endpoint(address, port))
        except zmq.ZMQError as error:
            self._close()
            raise GroupStoreError(
                f"the group's store cannot listen on {host}:{port}: {error}"
            ) from error
        # The port it listens on: ``port``, or the one the system gave for port 0.
        self.port = int(s.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2])
        self._waiters: list[_Waiter] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="group-store", daemon=True)
        self._thread.start()

    def callback(self, domain: str, key: bytes) -> bool:
        """The authenticator asks for every CURVE handshake: only the run's client key."""
        allowed = hmac.compare_digest(key, self._client_public)
        self.refused += not allowed
        return allowed

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        self._socket.close(linger=0)
        self._auth.stop()
        self._context.term()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stopped.is_set():
            now = time.monotonic()
            soonest = min((w.deadline for w in self._waiters), default=now + 1.0)
            wait_ms = max(0, min(_IDLE_POLL_MS, int((soonest - now) * 1000) + 1))
            if poller.poll(wait_ms):
                while self._socket.poll(0):
                    parts = self._socket.recv_multipart()
                    if len(parts) == 2:  # [peer, request]: anything else is no request of ours
                        self._handle(*parts)
            self._expire(time.monotonic())

    def _handle(self, peer: bytes, frame: bytes) -> None:
        try:
            request, op, *args = msgpack.unpackb(frame)
            if not isinstance(request, int) or not isinstance(op, str):
                raise TypeError
        except (ValueError, TypeError, msgpack.UnpackException):
            return  # not our client's: nothing to answer to
        try:
            self._do(peer, request, op, args)
        except (GroupStoreError, TypeError, ValueError, IndexError) as error:
            self._reply(peer, request, _ERROR, f"{op[:40]}: {error or type(error).__name__}")

    def _do(self, peer: bytes, request: int, op: str, args: list) -> None:
        t = self.table
        if op == "set":
            t.set(_key(args[0]), _bytes(args[1]))
            self._reply(peer, request, _OK, None)
            self._wake()
        elif op in ("get", "wait"):
            keys = [_key(k) for k in args[0]]
            waits_s = float(args[1])
            if not 0 <= waits_s <= _LONGEST_WAIT_S:
                raise ValueError(f"a wait of {waits_s} s: 0 to {_LONGEST_WAIT_S} s")
            waiter = _Waiter(peer, request, keys, time.monotonic() + waits_s, op == "get")
            if not self._answer(waiter):
                self._waiters.append(waiter)
        elif op == "add":
            self._reply(peer, request, _OK, t.add(_key(args[0]), int(args[1])))
            self._wake()
        elif op == "compare_set":
            value = t.compare_set(_key(args[0]), _bytes(args[1]), _bytes(args[2]))
            self._reply(peer, request, _OK, value)
            self._wake()
        elif op == "delete":
            self._reply(peer, request, _OK, t.delete(_key(args[0])))
        elif op == "check":
            self._reply(peer, request, _OK, t.has([_key(k) for k in args[0]]))
        elif op == "num_keys":
            self._reply(peer, request, _OK, len(t.values))
        else:
            raise GroupStoreError(f"no such operation {op[:40]!r}")

    def _answer(self, waiter: _Waiter) -> bool:
        if not self.table.has(waiter.keys):
            return False
        value = self.table.values[waiter.keys[0]] if waiter.value else None
        self._reply(waiter.peer, waiter.request, _OK, value)
        return True

    def _wake(self) -> None:
        self._waiters = [w for w in self._waiters if not self._answer(w)]

    def _expire(self, now: float) -> None:
        for waiter in [w for w in self._waiters if w.deadline <= now]:
            self._reply(waiter.peer, waiter.request, _TIMEOUT, None)
            self._waiters.remove(waiter)

    def _reply(self, peer: bytes, request: int, status: int, value: object) -> None:
        with contextlib.suppress(zmq.ZMQError):  # a peer gone: ROUTER drops the reply
            self._socket.send_multipart([peer, msgpack.packb([request, status, value])])


def _key(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a key is text, not {type(value).__name__}")
    return value


def _bytes(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"a value is bytes, not {type(value).__name__}")
    return value


class GroupStoreClient:
    """A rank's side (the leader's too): requests one at a time, from any thread.

    A connection the server closes (its process ended) is :class:`StoreGone` at once; a
    server that refuses the key is :class:`StoreRefused`; one that says nothing for
    ``timeout_s`` past what a request waits for is StoreGone too.
    """

    def __init__(self, host: str, port: int, secret: bytes, *, timeout_s: float):
        public, private = _curve_pair(secret, b"client")
        self.timeout_s = timeout_s
        self._context = zmq.Context()
        s = self._socket = self._context.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IPV6, ":" in host)
        s.setsockopt(zmq.CURVE_SERVERKEY, _curve_pair(secret, b"server")[0])
        s.setsockopt(zmq.CURVE_PUBLICKEY, public)
        s.setsockopt(zmq.CURVE_SECRETKEY, private)
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILURES
        self._monitor = s.get_monitor_socket(events)
        s.connect(_endpoint(host.strip("[]"), port))
        self._where = f"{host}:{port}"
        self._connected = False
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def call(self, op: str, *args: object, waits_s: float = 0.0) -> object:
        """The value the server replies with; GroupStoreError (StoreTimeout when the
        server's wait of ``waits_s`` ended first)."""
        with self._lock:
            request = next(self._ids)
            self._socket.send(msgpack.packb([request, op, *args]))
            deadline = time.monotonic() + waits_s + self.timeout_s
            while True:
                reply = self._next_reply(deadline)
                if reply[0] == request:
                    break  # an older request's late reply is dropped
        status, value = reply[1], reply[2]
        if status == _TIMEOUT:
            raise StoreTimeout(f"{op}: not set within {waits_s:g} s")
        if status != _OK:
            raise GroupStoreError(str(value))
        return value

    def _next_reply(self, deadline: float) -> list:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise StoreGone(f"the group's store at {self._where} does not answer")
            ready = dict(poller.poll(left_ms))
            if self._monitor in ready:
                self._read_monitor()
            if self._socket in ready:
                reply = msgpack.unpackb(self._socket.recv())
                if isinstance(reply, list) and len(reply) == 3:
                    return reply

    def _read_monitor(self) -> None:
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected = True
            elif event & _HANDSHAKE_FAILURES:
                raise StoreRefused(
                    f"the group's store at {self._where} refused this rank: every rank of "
                    "a group needs the same run secret (RUN_DIR/run.secret)"
                )
            elif event == zmq.EVENT_DISCONNECTED and self._connected:
                raise StoreGone(f"the group's store at {self._where} closed the connection")

    def close(self) -> None:
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)
        self._context.term()
