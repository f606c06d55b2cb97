"""The two small messages of a transfer, and how tags pair a reply with its request.

A receiver asks its source for one byte range of one version with a *request* (sent on
``REQUEST_TAG`` to the source's worker, which receives from anyone). The source answers
on the receiver's endpoint with a *header* on ``reply_tag`` and the *body* on
``reply_tag + 1``: the bytes themselves if the header says OK, else nothing (an empty
message). The receiver posts both receives before it asks, so the bytes land straight in
its buffer; every request is answered on both tags, so a source that says no leaves no
receive posted (closing an endpoint over TCP takes seconds to cancel one).

A request is sealed: its fields, packed, and a MAC over them (empty where the run has no
key; :mod:`..mac` says when a node insists on one), and it carries a *sequence* number
that goes up with each request the receiver makes, so a replay is told from a retry.

A request also carries the receiver's endpoint *generation* for that source: it goes up
each time the receiver closes its endpoint and makes a new one (after a failed fetch).
UCX pairs the two sides' endpoints, and without error handling nobody is told when one
closes: the source's endpoint to the receiver then still delivers small messages but no
longer rendezvous (large) ones, which the receiver sees cancelled. A source that sees a
new generation therefore replaces its own endpoint before it answers.
"""

from __future__ import annotations

import enum
import itertools
import random
import reprlib
from collections.abc import Callable
from dataclasses import dataclass

import msgpack
import numpy as np

__all__ = [
    "CONTROL_BYTES",
    "HEADER_BYTES",
    "REQUEST_TAG",
    "RangeRequest",
    "Status",
    "TagSource",
    "WireError",
    "decode_header",
    "decode_request",
    "encode_header",
    "encode_request",
]

REQUEST_TAG = 1
CONTROL_BYTES = 4096  # a request: the receiver's UCX address is most of it (~200-1000 B)
HEADER_BYTES = 64


class WireError(ValueError):
    """A control message that is not one; says what was wrong."""


class Status(enum.IntEnum):
    OK = 0
    GONE = 1  # the source no longer holds (or never held) that version
    BAD_REQUEST = 2


_STATUSES = frozenset(int(s) for s in Status)


@dataclass(frozen=True, slots=True)
class RangeRequest:
    version: int
    start: int
    end: int
    reply_tag: int
    address: bytes  # the receiver's worker address, to answer on
    generation: int = 0  # of the receiver's endpoint to the source
    sequence: int = 0  # of the receiver's requests, from 1 up (TagSource.sequence)


def _framed(body: bytes, size: int) -> np.ndarray:
    if len(body) + 4 > size:
        raise WireError(f"control message of {len(body)} bytes exceeds {size - 4}")
    out = np.zeros(size, np.uint8)
    out[:4] = np.frombuffer(len(body).to_bytes(4, "little"), np.uint8)
    out[4 : 4 + len(body)] = np.frombuffer(body, np.uint8)
    return out


def _unframed(frame: np.ndarray) -> object:
    length = int.from_bytes(frame[:4].tobytes(), "little")
    if length > frame.size - 4:
        raise WireError(f"length {length} exceeds the {frame.size - 4}-byte frame")
    try:
        return msgpack.unpackb(frame[4 : 4 + length].tobytes())
    except Exception as error:  # msgpack raises several unrelated types
        raise WireError(f"not MessagePack: {error}") from None


def encode_request(
    request: RangeRequest, seal: Callable[[bytes], bytes] | None = None
) -> np.ndarray:
    """The request's frame; ``seal`` gives the MAC of its packed fields (none: no MAC)."""
    r = request
    fields = msgpack.packb(
        [r.version, r.start, r.end, r.reply_tag, r.address, r.generation, r.sequence]
    )
    return _framed(msgpack.packb([fields, b"" if seal is None else seal(fields)]), CONTROL_BYTES)


def decode_request(
    frame: np.ndarray, verify: Callable[[bytes, bytes], None] | None = None
) -> RangeRequest:
    """The request in ``frame``; ``verify(fields, mac)`` raises for one not to be served,
    before its fields are parsed."""
    sealed = _unframed(frame)
    if not (
        isinstance(sealed, list)
        and len(sealed) == 2
        and all(isinstance(part, bytes) for part in sealed)
    ):
        raise WireError(f"request must be [fields, mac], got {_shown(sealed)}")
    fields, mac = sealed
    if verify is not None:
        verify(fields, mac)
    try:
        body = msgpack.unpackb(fields)
    except Exception as error:  # msgpack raises several unrelated types
        raise WireError(f"request fields not MessagePack: {error}") from None
    if not (isinstance(body, list) and len(body) == 7):
        raise WireError(
            "request must be [version, start, end, reply_tag, address, generation, sequence], "
            f"got {_shown(body)}"
        )
    version, start, end, reply_tag, address, generation, sequence = body
    numbers = (version, start, end, reply_tag, generation, sequence)
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in numbers):
        raise WireError(f"request fields must be non-negative integers: {_shown(numbers)}")
    if start > end:
        raise WireError(f"range [{start}, {end}) runs backwards")
    if not isinstance(address, bytes) or not address:
        raise WireError(f"reply address must be non-empty bytes, got {_shown(address)}")
    return RangeRequest(version, start, end, reply_tag, address, generation, sequence)


def encode_header(status: Status, detail: str = "") -> np.ndarray:
    # Clipped in UTF-8 bytes, not characters: 40 characters of non-ASCII text would not
    # fit the frame. A character cut in two is dropped.
    clipped = detail.encode("utf-8", "replace")[:40].decode("utf-8", "ignore")
    return _framed(msgpack.packb([int(status), clipped]), HEADER_BYTES)


def decode_header(frame: np.ndarray) -> tuple[Status, str]:
    body = _unframed(frame)
    if isinstance(body, list) and len(body) == 2:
        status, detail = body
        if type(status) is int and status in _STATUSES and type(detail) is str:
            return Status(status), detail
    raise WireError(f"header must be [status, detail], got {_shown(body)}")


def _shown(value: object) -> str:
    """``value`` for an error message, cut short: a few levels and items of it (a body
    nested a thousand deep has no repr)."""
    return reprlib.repr(value)[:80]


class TagSource:
    """Reply tags unique to this receiver: a random 31-bit prefix, then a counter; and the
    sequence numbers of its requests, which never wrap."""

    def __init__(self) -> None:
        self._base = (random.SystemRandom().getrandbits(31) | 1) << 32
        self._next = 0
        self._sequence = itertools.count(1)

    def sequence(self) -> int:
        return next(self._sequence)

    def take(self) -> int:
        tag = self._base | (self._next << 1)
        self._next = (self._next + 1) % (1 << 30)
        return tag
