"""The wire protocol: how the messages of :mod:`.messages` travel, in MessagePack.

A message (a msgspec Struct with a ``KIND``) is one multipart message on the wire::

    frame 0      msgpack [PROTOCOL_VERSION, kind, req_id, body]
    frame 1..n   the raw bytes of each array, in order, never copied into frame 0

``body`` is the message's fields in declaration order (nested structs as lists too). An
array anywhere in a body is a MessagePack extension naming its frame, dtype and shape.
``req_id`` pairs a reply with its request; events and one-way messages use 0. Nothing is
pickled: msgspec decodes ``body`` straight into the declared type of its kind, checking
every field in C, so a frame that is not a valid message of this version is a
:class:`ProtocolError` naming the message and field that were wrong.

Transport code knows this module; it knows nothing of what the payloads mean.
"""

from __future__ import annotations

import math
import threading
import typing
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from .messages import (
    PROTOCOL_VERSION,
    RUN_FINISHED,
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
    Rewind,
    Shutdown,
    Status,
    StatusReply,
    StepDone,
    Stop,
    Unlock,
    Want,
    WantWeights,
    WeightsPlan,
)
from .protocol_errors import ProtocolError, bad_utf8_at, is_bad_utf8, what_is_wrong

__all__ = [
    "PROTOCOL_VERSION",
    "RUN_FINISHED",
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
    "Rewind",
    "Shutdown",
    "Status",
    "StatusReply",
    "StepDone",
    "Stop",
    "Unlock",
    "Want",
    "WantWeights",
    "WeightsPlan",
    "decode",
    "decode_with_id",
    "encode",
    "pack_payload",
    "payload_frames",
    "payload_from_frames",
    "request_id",
    "unpack_payload",
]

_ARRAY_EXT = 1  # MessagePack extension code of an array reference: [frame, dtype, shape]
_INLINE_ARRAY_EXT = 2  # an array stored inside a payload blob: [dtype, shape, bytes]
_DTYPES = frozenset(
    {"bool", "float16", "float32", "float64"}
    | {f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)}
)
_MAX_DIMS = 8
# numpy computes ``dtype.name`` in Python on every access (several µs); the allowed dtypes
# are looked up here instead. Other dtypes (byte-swapped ones too) take the slow path.
_DTYPE_NAMES: dict[np.dtype[Any], str] = {np.dtype(name): name for name in _DTYPES}


# --- encoding ---------------------------------------------------------------------------


class _Codec(threading.local):
    """This thread's encoders and the array frames of the message being encoded or decoded.

    msgspec's encoders reuse their buffers between calls; one set per thread, because links
    encode on their callers' threads and the array hooks keep per-message state here.
    """

    def __init__(self) -> None:
        self.buffers: list[bytes | memoryview] = []
        self.frames: Sequence[Any] = ()
        self.unused: set[int] = set()
        self.message = msgspec.msgpack.Encoder(enc_hook=self._to_frame)
        self.blob = msgspec.msgpack.Encoder(enc_hook=_inline)
        self.plain = msgspec.msgpack.Encoder()

    def _to_frame(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            name = _allowed_dtype(obj, "sent")
            array = np.ascontiguousarray(obj)
            self.buffers.append(memoryview(array).cast("B") if array.size else b"")
            ref = self.plain.encode((len(self.buffers), name, array.shape))
            return msgspec.msgpack.Ext(_ARRAY_EXT, ref)
        return _plain_value(obj, "send")


def _allowed_dtype(array: np.ndarray, verb: str) -> str:
    name = _DTYPE_NAMES.get(array.dtype) or array.dtype.name
    if name not in _DTYPES:
        raise TypeError(f"arrays of dtype {array.dtype} are not {verb}; use one of {_DTYPES}")
    return name


def _plain_value(obj: Any, verb: str) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot {verb} a {type(obj).__name__}")


def _inline(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        name = _allowed_dtype(obj, "kept")
        array = np.ascontiguousarray(obj)
        return msgspec.msgpack.Ext(
            _INLINE_ARRAY_EXT, _CODEC.plain.encode((name, array.shape, array.tobytes()))
        )
    return _plain_value(obj, "keep")


_CODEC = _Codec()


def encode(message: Message, req_id: int = 0) -> list[bytes | memoryview]:
    """Frames for ``message``: the header, then every array's bytes (zero-copy)."""
    return _with_array_frames((PROTOCOL_VERSION, message.KIND, req_id, message))


def _with_array_frames(value: Any) -> list[bytes | memoryview]:
    """``value`` packed, then the bytes of each array in it as a frame of its own."""
    codec = _CODEC
    codec.buffers = []
    try:
        return [codec.message.encode(value), *codec.buffers]
    finally:
        codec.buffers = []  # holds no caller's array past this call


def _from_array_frames(decoder: msgspec.msgpack.Decoder, packed: Any, arrays: Sequence[Any]) -> Any:
    """``packed`` decoded, its array references resolved to views on ``arrays``; an array
    frame it never names is a ProtocolError. msgspec's own errors pass through."""
    codec = _CODEC
    codec.frames, codec.unused = arrays, set(range(1, len(arrays) + 1))
    try:
        value = decoder.decode(packed)
    finally:
        unused, codec.frames, codec.unused = codec.unused, (), set()
    if unused:
        raise ProtocolError(f"array frames {sorted(unused)[:5]} are never used")
    return value


# --- decoding ---------------------------------------------------------------------------

_HEADER = msgspec.msgpack.Decoder(tuple[int, int, int, msgspec.Raw])


def decode(frames: Sequence[Any]) -> Message:
    """The message in ``frames`` (bytes or buffers); ProtocolError if it is not valid."""
    return decode_with_id(frames)[0]


def decode_with_id(frames: Sequence[Any]) -> tuple[Message, int]:
    """:func:`decode`, with the message's req_id, read from the same unpacking of the header."""
    if not frames:
        raise ProtocolError("empty message")
    version, kind, req_id, body = _header(frames[0])
    req_id = req_id if 0 <= req_id < 2**63 else 0
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {version!r}; this side speaks {PROTOCOL_VERSION}", req_id
        )
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ProtocolError(f"unknown message kind {kind!r}", req_id)
    try:
        return _from_array_frames(decoder, body, frames[1:]), req_id
    except Exception as error:  # whatever another process sent: an error that says what
        raise ProtocolError(what_is_wrong(_BY_KIND[kind], body, error), req_id) from None


def request_id(frames: Sequence[Any]) -> int:
    """The req_id of a header that decodes at all (for replies to invalid messages)."""
    try:
        req_id = _header(frames[0])[2]
    except (ProtocolError, IndexError):
        return 0
    return req_id if 0 <= req_id < 2**63 else 0


def _header(frame: Any) -> tuple[int, int, int, msgspec.Raw]:
    try:
        return _HEADER.decode(frame)
    except msgspec.ValidationError:
        raise ProtocolError("header must be [version, kind, req_id, body]") from None
    except Exception as error:
        raise ProtocolError(f"header is not MessagePack: {error}") from None


def _array(code: int, data: memoryview) -> np.ndarray:
    """Resolves an array reference while a body is decoded: a view on its frame."""
    if code != _ARRAY_EXT:
        raise ProtocolError(f"unknown MessagePack extension {code}")
    try:
        index, dtype_name, shape = msgspec.msgpack.decode(data)
    except Exception:
        raise ProtocolError("array reference is not [frame, dtype, shape]") from None
    frames = _CODEC.frames
    if type(index) is not int or not 1 <= index <= len(frames):
        raise ProtocolError(f"array frame {index!r:.20} is missing ({len(frames)} sent)")
    if type(dtype_name) is not str or dtype_name not in _DTYPES:
        raise ProtocolError(f"array {index}: dtype {dtype_name!r:.20} is not allowed")
    if not (
        isinstance(shape, list)
        and len(shape) <= _MAX_DIMS
        and all(type(d) is int and d >= 0 for d in shape)
    ):
        raise ProtocolError(f"array {index}: shape {shape!r:.80} is not a list of sizes")
    dtype = np.dtype(dtype_name)
    buffer = memoryview(frames[index - 1]).cast("B")
    expected = math.prod(shape) * dtype.itemsize
    if buffer.nbytes != expected:
        raise ProtocolError(
            f"array {index}: {buffer.nbytes} bytes for {dtype_name}{shape} (needs {expected})"
        )
    try:  # numpy refuses sizes past its index type, even of an empty array
        array = np.frombuffer(buffer, dtype=dtype).reshape(shape)
    except ValueError:
        raise ProtocolError(f"array {index}: shape {shape} is too large") from None
    _CODEC.unused.discard(index)
    return array


# --- payloads as frames: the data plane's form -------------------------------------------


def payload_frames(payload: Payload) -> list[bytes | memoryview]:
    """``payload`` as frames: a MessagePack header, then each array's bytes (zero-copy),
    exactly as arrays travel in a message."""
    return _with_array_frames(payload)


def payload_from_frames(frames: Sequence[Any]) -> Payload:
    """The payload of :func:`payload_frames`' frames, arrays as views on them; a
    ProtocolError if they are not one."""
    try:
        return _from_array_frames(_FRAMED_PAYLOAD, frames[0], frames[1:])
    except ProtocolError as error:  # an array reference, or an array frame unused
        raise ProtocolError(f"payload: {error}") from None
    except Exception as error:  # whatever its holder sent: an error that says what
        if is_bad_utf8(error):
            where = bad_utf8_at(frames[0])
            detail = f"invalid UTF-8 - at `{where}`"
        else:
            detail = str(error)
        raise ProtocolError(f"payload is not a map of str: {detail}") from None


# --- payloads at rest -------------------------------------------------------------------


def pack_payload(payload: Payload) -> bytes:
    """One blob for a payload, arrays inline: how a worker keeps it and the journal holds it."""
    return _CODEC.blob.encode(payload)


def unpack_payload(blob: bytes | memoryview) -> Payload:
    """The payload :func:`pack_payload` made (blobs come only from this run's own processes)."""
    return _PAYLOAD.decode(blob)


def _stored_array(code: int, data: memoryview) -> Any:
    if code != _INLINE_ARRAY_EXT:
        raise ProtocolError(f"unknown MessagePack extension {code} in a stored payload")
    dtype, shape, raw = msgspec.msgpack.decode(data)
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


_PAYLOAD = msgspec.msgpack.Decoder(dict[str, Any], ext_hook=_stored_array)
_FRAMED_PAYLOAD = msgspec.msgpack.Decoder(dict[str, Any], ext_hook=_array)
_MESSAGES: tuple[type, ...] = typing.get_args(Message)
_BY_KIND: dict[int, type] = {int(cls.KIND): cls for cls in _MESSAGES}
_DECODERS = {kind: msgspec.msgpack.Decoder(cls, ext_hook=_array) for kind, cls in _BY_KIND.items()}
assert len(_BY_KIND) == len(_MESSAGES), "two messages share a kind"
