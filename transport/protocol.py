"""The wire protocol: every message kind, declared once, and its MessagePack encoding.

A message is a frozen dataclass with a ``KIND``. On the wire it is one multipart message::

    frame 0      msgpack [PROTOCOL_VERSION, kind, req_id, body, arrays]
    frame 1..n   the raw bytes of each array, in order, never copied into frame 0

``body`` lists the fields in declaration order (nested messages as lists too). An array
anywhere in a body is replaced by a MessagePack extension naming its frame; ``arrays``
holds each frame's ``[dtype, shape]``. ``req_id`` pairs a reply with its request; events
and one-way messages use 0. Nothing is pickled: :func:`decode` builds only the types
declared here and checks every field against its annotation, so a frame that is not a
valid message of this version is a :class:`ProtocolError` naming what was wrong.

Transport code knows this module; it knows nothing of what the payloads mean.
"""

from __future__ import annotations

import math
import threading
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, ClassVar

import msgpack
import numpy as np

from . import _compiled, _typed

__all__ = [
    "PROTOCOL_VERSION",
    "Ack",
    "AddGroups",
    "Added",
    "Bye",
    "Claim",
    "Complete",
    "Error",
    "Event",
    "Fail",
    "Heartbeat",
    "Hello",
    "Item",
    "Kind",
    "Lease",
    "LoadedVersion",
    "Lock",
    "LockGranted",
    "LockQueued",
    "Message",
    "NewGroup",
    "NoWork",
    "Payload",
    "ProtocolError",
    "PublishVersion",
    "Ready",
    "Report",
    "Result",
    "Shutdown",
    "Status",
    "StatusReply",
    "Stop",
    "Unlock",
    "Want",
    "WantWeights",
    "WeightsPlan",
    "decode",
    "decode_with_id",
    "encode",
    "pack_payload",
    "unpack_payload",
]

PROTOCOL_VERSION = 1

Payload = dict[str, Any]
"""A role's result for one group: str keys; values are MessagePack types or numpy arrays."""

_ARRAY_EXT = 1  # MessagePack extension code of an array reference: [frame, dtype, shape]
_INLINE_ARRAY_EXT = 2  # an array stored inside a payload blob: [dtype, shape, bytes]
_DTYPES = frozenset(
    {"bool", "float16", "float32", "float64"}
    | {f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}
)
_MAX_DIMS = 8
_MAX_ARRAYS = 65_536


class Kind(IntEnum):
    # worker -> scheduler (requests)
    HELLO = 1
    HEARTBEAT = 2
    CLAIM = 3
    COMPLETE = 4
    FAIL = 5
    LOCK = 6
    UNLOCK = 7
    PUBLISH_VERSION = 8
    LOADED_VERSION = 9
    ADD_GROUPS = 10
    BYE = 11
    REPORT = 12
    WANT_WEIGHTS = 13
    # observers -> scheduler
    STATUS = 20
    STOP = 21
    # scheduler -> worker (replies)
    READY = 40
    ACK = 41
    ERROR = 42
    LEASE = 43
    NO_WORK = 44
    WANT = 45
    ADDED = 46
    LOCK_GRANTED = 47
    LOCK_QUEUED = 48
    STATUS_REPLY = 49
    SHUTDOWN = 50
    WEIGHTS_PLAN = 51
    # scheduler -> everyone (PUB)
    EVENT = 60


class ProtocolError(ValueError):
    """Frames that are not a valid message of this protocol version; says what was wrong."""

    def __init__(self, detail: str, req_id: int = 0) -> None:
        super().__init__(detail)
        self.req_id = req_id


# --- requests ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """First message of a worker: who it is. Answered by Ready, or Error on a mismatch."""

    KIND: ClassVar[Kind] = Kind.HELLO
    worker: str
    role: str
    protocol: int
    pid: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Alive. ``leases``: the ones the worker holds, the only ones renewed (None: all)."""

    KIND: ClassVar[Kind] = Kind.HEARTBEAT
    worker: str
    leases: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """Ask for up to ``n`` groups of the role's work (the dataloader: how many to add)."""

    KIND: ClassVar[Kind] = Kind.CLAIM
    worker: str
    role: str
    n: int


@dataclass(frozen=True, slots=True)
class Result:
    """One group's result; admitted work (generate) carries its (min, max) policy versions."""

    gid: int
    data: Payload
    behaviour: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Complete:
    """Results of a lease; a train step may add the step's metrics."""

    KIND: ClassVar[Kind] = Kind.COMPLETE
    worker: str
    lease_id: int
    fence: int
    results: tuple[Result, ...]
    metrics: Payload | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """Give groups of a lease back (all of them when ``gids`` is None) to be tried again."""

    KIND: ClassVar[Kind] = Kind.FAIL
    worker: str
    lease_id: int
    fence: int
    gids: tuple[int, ...] | None
    reason: str


@dataclass(frozen=True, slots=True)
class Lock:
    KIND: ClassVar[Kind] = Kind.LOCK
    worker: str
    resource: str
    lease_id: int
    fence: int


@dataclass(frozen=True, slots=True)
class Unlock:
    KIND: ClassVar[Kind] = Kind.UNLOCK
    worker: str
    resource: str
    token: int


@dataclass(frozen=True, slots=True)
class PublishVersion:
    """The trainer made ``version`` available.

    ``weights``: the weight plane's manifest for it (opaque here, passed on to receivers),
    None where weights travel another way (files); ``address``: where the publisher serves
    them on the weight plane.
    """

    KIND: ClassVar[Kind] = Kind.PUBLISH_VERSION
    worker: str
    version: int
    weights: Payload | None = None
    address: bytes = b""


@dataclass(frozen=True, slots=True)
class LoadedVersion:
    KIND: ClassVar[Kind] = Kind.LOADED_VERSION
    worker: str
    version: int


@dataclass(frozen=True, slots=True)
class Report:
    """A worker's measurement that belongs to no lease, e.g. a validation pass.

    ``name`` says what it is ("validation"); ``version`` is the policy version measured.
    """

    KIND: ClassVar[Kind] = Kind.REPORT
    worker: str
    name: str
    version: int
    data: Payload


@dataclass(frozen=True, slots=True)
class WantWeights:
    """Whom to fetch ``version``'s weights from (0: the newest announced). Answered by
    WeightsPlan, or Error when no announcement for that version is held.

    ``address``: the asker's own weight-plane address if it can relay to others (b"": it
    cannot); ``failed``: a source that failed the asker (timed out, corrupt bytes), which
    it is not given again.
    """

    KIND: ClassVar[Kind] = Kind.WANT_WEIGHTS
    worker: str
    version: int
    address: bytes = b""
    failed: str = ""


@dataclass(frozen=True, slots=True)
class NewGroup:
    key: str
    data: Payload


@dataclass(frozen=True, slots=True)
class AddGroups:
    """New prompt groups; keys the scheduler already knows are skipped, not added twice."""

    KIND: ClassVar[Kind] = Kind.ADD_GROUPS
    worker: str
    groups: tuple[NewGroup, ...]


@dataclass(frozen=True, slots=True)
class Bye:
    """The worker is leaving on purpose (drained): its registration ends now."""

    KIND: ClassVar[Kind] = Kind.BYE
    worker: str
    reason: str


@dataclass(frozen=True, slots=True)
class Status:
    KIND: ClassVar[Kind] = Kind.STATUS


@dataclass(frozen=True, slots=True)
class Stop:
    """Drain: no new leases; the scheduler exits once running leases end."""

    KIND: ClassVar[Kind] = Kind.STOP
    reason: str


# --- replies ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """Hello accepted. Durations are the scheduler's, so every worker paces alike."""

    KIND: ClassVar[Kind] = Kind.READY
    worker: str
    run: str
    protocol: int
    heartbeat_interval_s: float
    lease_timeout_s: float
    max_message_bytes: int
    policy_version: int  # the newest published weights, for a generator to load first


@dataclass(frozen=True, slots=True)
class Ack:
    KIND: ClassVar[Kind] = Kind.ACK
    count: int = 0


@dataclass(frozen=True, slots=True)
class Error:
    """A request was refused. ``code`` is a core Reason or a protocol-level one."""

    KIND: ClassVar[Kind] = Kind.ERROR
    code: str
    detail: str


@dataclass(frozen=True, slots=True)
class Item:
    """A leased group: its key and what earlier stages produced, by role."""

    gid: int
    key: str
    data: dict[str, Payload]


@dataclass(frozen=True, slots=True)
class Lease:
    """Work for the worker until ``expires_in_s`` from now unless heartbeats renew it.

    Relative, not a timestamp: worker and scheduler clocks need not agree.
    """

    KIND: ClassVar[Kind] = Kind.LEASE
    lease_id: int
    fence: int
    role: str
    expires_in_s: float
    version: int | None
    items: tuple[Item, ...]


@dataclass(frozen=True, slots=True)
class NoWork:
    KIND: ClassVar[Kind] = Kind.NO_WORK
    reason: str


@dataclass(frozen=True, slots=True)
class Want:
    """Reply to a dataloader's claim: how many new groups the pipeline can take now."""

    KIND: ClassVar[Kind] = Kind.WANT
    count: int


@dataclass(frozen=True, slots=True)
class Added:
    KIND: ClassVar[Kind] = Kind.ADDED
    added: tuple[str, ...]
    skipped: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LockGranted:
    KIND: ClassVar[Kind] = Kind.LOCK_GRANTED
    resource: str
    lease_id: int
    token: int


@dataclass(frozen=True, slots=True)
class LockQueued:
    KIND: ClassVar[Kind] = Kind.LOCK_QUEUED
    resource: str
    lease_id: int
    position: int


@dataclass(frozen=True, slots=True)
class StatusReply:
    KIND: ClassVar[Kind] = Kind.STATUS_REPLY
    summary: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Shutdown:
    """The run is over or draining: the worker finishes what it holds and exits."""

    KIND: ClassVar[Kind] = Kind.SHUTDOWN
    reason: str


@dataclass(frozen=True, slots=True)
class WeightsPlan:
    """Fetch ``version`` (its ``manifest``) from worker ``source`` at ``source_address``."""

    KIND: ClassVar[Kind] = Kind.WEIGHTS_PLAN
    version: int
    manifest: Payload
    source: str
    source_address: bytes


# --- events -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """A PUB message. ``seq`` numbers every event, so a subscriber sees gaps."""

    KIND: ClassVar[Kind] = Kind.EVENT
    seq: int
    topic: str
    body: dict[str, Any]


Message = (
    Hello
    | Heartbeat
    | Claim
    | Complete
    | Fail
    | Lock
    | Unlock
    | PublishVersion
    | LoadedVersion
    | Report
    | WantWeights
    | AddGroups
    | Bye
    | Status
    | Stop
    | Ready
    | Ack
    | Error
    | Lease
    | NoWork
    | Want
    | Added
    | LockGranted
    | LockQueued
    | StatusReply
    | Shutdown
    | WeightsPlan
    | Event
)

# --- encoding ---------------------------------------------------------------------------

# A thread keeps its packers' buffers; one that grew past this for a big message is dropped.
_KEEP_BUFFER_BYTES = 1 << 20


class _Packers(threading.local):
    """This thread's MessagePack packers, and the array frames of the message it encodes.

    ``msgpack.packb`` makes and frees a packer with a 256 KiB buffer on every call, which
    costs more than packing a small header does; a kept packer reuses its buffer. One set
    per thread: a packer is not thread-safe, and links encode on their callers' threads.
    """

    def __init__(self) -> None:
        self.buffers: list[bytes | memoryview] = []
        self._new_header()
        self._new_blob()
        self.plain = msgpack.Packer()  # array descriptions, packed from the others' hooks

    def _new_header(self) -> None:
        self.header = msgpack.Packer(default=self._to_frame, use_bin_type=True)

    def _new_blob(self) -> None:
        self.blob = msgpack.Packer(default=self._inline, use_bin_type=True)

    def pack_header(self, header: list[Any]) -> tuple[bytes, list[bytes | memoryview]]:
        self.buffers = []
        try:
            packed = self.header.pack(header)
            buffers = self.buffers
        finally:
            self.buffers = []  # holds no caller's array past this call
        if len(packed) > _KEEP_BUFFER_BYTES:
            self._new_header()
        return packed, buffers

    def pack_blob(self, payload: Payload) -> bytes:
        packed = self.blob.pack(payload)
        if len(packed) > _KEEP_BUFFER_BYTES:
            self._new_blob()
        return packed

    def _to_frame(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            name = _dtype_name(obj.dtype)
            if name not in _DTYPES:
                raise TypeError(f"arrays of dtype {obj.dtype} are not sent; use one of {_DTYPES}")
            array = np.ascontiguousarray(obj)
            self.buffers.append(memoryview(array).cast("B") if array.size else b"")
            ref = [len(self.buffers), name, list(array.shape)]
            return msgpack.ExtType(_ARRAY_EXT, self.plain.pack(ref))
        if isinstance(obj, tuple):
            return list(obj)
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"cannot send a {type(obj).__name__}")

    def _inline(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            name = _dtype_name(obj.dtype)
            if name not in _DTYPES:
                raise TypeError(f"arrays of dtype {obj.dtype} are not kept; use one of {_DTYPES}")
            array = np.ascontiguousarray(obj)
            desc = self.plain.pack([name, list(array.shape), array.tobytes()])
            return msgpack.ExtType(_INLINE_ARRAY_EXT, desc)
        if isinstance(obj, tuple):
            return list(obj)
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"cannot keep a {type(obj).__name__}")


_PACKERS = _Packers()
# numpy computes ``dtype.name`` in Python on every access (several µs); the allowed dtypes
# are looked up here instead. Other dtypes (byte-swapped ones too) take the slow path.
_DTYPE_NAMES: dict[np.dtype[Any], str] = {np.dtype(name): name for name in _DTYPES}


def _dtype_name(dtype: np.dtype[Any]) -> str:
    return _DTYPE_NAMES.get(dtype) or dtype.name


def encode(message: Message, req_id: int = 0) -> list[bytes | memoryview]:
    """Frames for ``message``: the header, then every array's bytes (zero-copy)."""
    header, buffers = _PACKERS.pack_header(
        [PROTOCOL_VERSION, int(message.KIND), req_id, _compiled.to_wire(message)]
    )
    return [header, *buffers]


def decode(frames: Sequence[Any]) -> Message:
    """The message in ``frames`` (bytes or buffers); ProtocolError if it is not valid."""
    return decode_with_id(frames)[0]


def decode_with_id(frames: Sequence[Any]) -> tuple[Message, int]:
    """:func:`decode`, with the message's req_id, read from the same unpacking of the header."""
    if not frames:
        raise ProtocolError("empty message")
    arrays = _ArrayFrames(frames[1:])
    try:
        header = msgpack.unpackb(
            frames[0],
            raw=False,
            strict_map_key=True,
            ext_hook=arrays.hook,
            max_array_len=_MAX_ARRAYS,
            max_map_len=_MAX_ARRAYS,
        )
    except ProtocolError as error:
        raise ProtocolError(str(error), request_id(frames)) from None
    except Exception as error:
        raise ProtocolError(f"header is not MessagePack: {error}") from None
    if not isinstance(header, list) or len(header) != 4:
        raise ProtocolError("header must be [version, kind, req_id, body]")
    version, kind, req_id, body = header
    req_id = req_id if type(req_id) is int and 0 <= req_id < 2**63 else 0
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version!r}; this side speaks {PROTOCOL_VERSION}", req_id
        )
    cls = _BY_KIND.get(kind) if type(kind) is int else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {kind!r}", req_id)
    if arrays.unused:
        raise ProtocolError(f"array frames {sorted(arrays.unused)[:5]} are never used", req_id)
    try:
        return _compiled.build(cls, body), req_id
    except _typed.Invalid as bad:
        raise ProtocolError(bad.describe(cls.__name__), req_id) from None


def request_id(frames: Sequence[Any]) -> int:
    """The req_id of a header that decodes at all (for replies to invalid messages)."""
    try:
        header = msgpack.unpackb(frames[0], raw=False, ext_hook=lambda _code, _data: None)
        req_id = header[2]
        return req_id if type(req_id) is int and 0 <= req_id < 2**63 else 0
    except Exception:
        return 0


class _ArrayFrames:
    """Resolves array references while the header is unpacked: views on the frames."""

    def __init__(self, frames: Sequence[Any]) -> None:
        self._frames = frames
        self.unused = set(range(1, len(frames) + 1))

    def hook(self, code: int, data: bytes) -> np.ndarray:
        if code != _ARRAY_EXT:
            raise ProtocolError(f"unknown MessagePack extension {code}")
        try:
            index, dtype_name, shape = msgpack.unpackb(data)
        except Exception:
            raise ProtocolError("array reference is not [frame, dtype, shape]") from None
        if type(index) is not int or not 1 <= index <= len(self._frames):
            raise ProtocolError(f"array frame {index!r:.20} is missing ({len(self._frames)} sent)")
        if dtype_name not in _DTYPES:
            raise ProtocolError(f"array {index}: dtype {dtype_name!r:.20} is not allowed")
        if not (
            isinstance(shape, list)
            and len(shape) <= _MAX_DIMS
            and all(type(d) is int and d >= 0 for d in shape)
        ):
            raise ProtocolError(f"array {index}: shape {shape!r:.80} is not a list of sizes")
        dtype = np.dtype(dtype_name)
        buffer = memoryview(self._frames[index - 1]).cast("B")
        expected = math.prod(shape) * dtype.itemsize
        if buffer.nbytes != expected:
            raise ProtocolError(
                f"array {index}: {buffer.nbytes} bytes for {dtype_name}{shape} (needs {expected})"
            )
        self.unused.discard(index)
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)


# --- payloads at rest -------------------------------------------------------------------


def pack_payload(payload: Payload) -> bytes:
    """One blob for a payload, arrays inline: how the scheduler journals and keeps it."""
    return _PACKERS.pack_blob(payload)


def unpack_payload(blob: bytes) -> Payload:
    """The payload :func:`pack_payload` made (blobs come only from the scheduler's journal)."""
    return msgpack.unpackb(blob, raw=False, ext_hook=_stored_array)


def _stored_array(code: int, data: bytes) -> Any:
    if code != _INLINE_ARRAY_EXT:
        raise ProtocolError(f"unknown MessagePack extension {code} in a stored payload")
    dtype, shape, raw = msgpack.unpackb(data)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


_MESSAGES: tuple[type, ...] = typing.get_args(Message)
_BY_KIND: dict[int, type] = {int(cls.KIND): cls for cls in _MESSAGES}


def _register() -> None:
    for cls in [Result, Item, NewGroup, *_MESSAGES]:  # nested ones first
        _compiled.register(cls, globals())


_register()
assert len(_BY_KIND) == len(_MESSAGES), "two messages share a kind"
