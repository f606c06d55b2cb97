"""The wire protocol: how the messages of :mod:`.messages` travel, in MessagePack.

A message (a frozen dataclass with a ``KIND``) is one multipart message on the wire::

    frame 0      msgpack [PROTOCOL_VERSION, kind, req_id, body, arrays]
    frame 1..n   the raw bytes of each array, in order, never copied into frame 0

``body`` lists the fields in declaration order (nested messages as lists too). An array
anywhere in a body is replaced by a MessagePack extension naming its frame; ``arrays``
holds each frame's ``[dtype, shape]``. ``req_id`` pairs a reply with its request; events
and one-way messages use 0. Nothing is pickled: :func:`decode` builds only the types
declared in :mod:`.messages` and checks every field against its annotation, so a frame
that is not a valid message of this version is a :class:`ProtocolError` naming what was
wrong.

Transport code knows this module; it knows nothing of what the payloads mean.
"""

from __future__ import annotations

import math
import threading
import typing
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from . import _compiled, _typed, messages
from .messages import (
    PROTOCOL_VERSION,
    Ack,
    Added,
    AddGroups,
    Bye,
    Claim,
    Complete,
    Drop,
    Error,
    Event,
    Fail,
    Heartbeat,
    Held,
    Hello,
    Item,
    Kind,
    Lease,
    LoadedVersion,
    Lock,
    LockGranted,
    LockQueued,
    LostPayload,
    Message,
    NewGroup,
    NoWork,
    Payload,
    PayloadRef,
    PublishVersion,
    Ready,
    Report,
    Result,
    Shutdown,
    Status,
    StatusReply,
    Stop,
    Unlock,
    Want,
    WantWeights,
    WeightsPlan,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Ack",
    "AddGroups",
    "Added",
    "Bye",
    "Claim",
    "Complete",
    "Drop",
    "Error",
    "Event",
    "Fail",
    "Heartbeat",
    "Held",
    "Hello",
    "Item",
    "Kind",
    "Lease",
    "LoadedVersion",
    "Lock",
    "LockGranted",
    "LockQueued",
    "LostPayload",
    "Message",
    "NewGroup",
    "NoWork",
    "Payload",
    "PayloadRef",
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

_ARRAY_EXT = 1  # MessagePack extension code of an array reference: [frame, dtype, shape]
_INLINE_ARRAY_EXT = 2  # an array stored inside a payload blob: [dtype, shape, bytes]
_DTYPES = frozenset(
    {"bool", "float16", "float32", "float64"}
    | {f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}
)
_MAX_DIMS = 8
_MAX_ARRAYS = 65_536


class ProtocolError(ValueError):
    """Frames that are not a valid message of this protocol version; says what was wrong."""

    def __init__(self, detail: str, req_id: int = 0) -> None:
        super().__init__(detail)
        self.req_id = req_id


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
    nested = [PayloadRef, LostPayload, Result, Item, NewGroup]
    for cls in [*nested, *_MESSAGES]:  # nested ones first
        _compiled.register(cls, vars(messages))


_register()
assert len(_BY_KIND) == len(_MESSAGES), "two messages share a kind"
