"""A payload as one contiguous image: its frames laid end to end, each array aligned.

The image is what a store keeps (in a shared-memory file where it can), what a checksum
covers, and what a fetch moves as a single frame; a reader that maps or receives it gets
the payload's arrays as views on it, never copies::

    <4s magic><u32 frames> <u64 length> * frames   then each frame, from a 64-byte boundary
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from .. import protocol as p

__all__ = ["ImageError", "read", "size_of", "write"]

_MAGIC = b"ARP1"
_HEAD = struct.Struct("<4sI")
_LENGTH = struct.Struct("<Q")
_ALIGN = 64  # a cache line: arrays start where vector loads like them
_MAX_FRAMES = 1 << 16


class ImageError(ValueError):
    """Bytes that are not a payload image (a bug or rot the checksum did not catch)."""


def _offsets(lengths: Sequence[int]) -> tuple[list[int], int]:
    at = _align(_HEAD.size + _LENGTH.size * len(lengths))
    offsets = []
    for length in lengths:
        offsets.append(at)
        at = _align(at + length)
    return offsets, at


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def size_of(frames: Sequence[Any]) -> int:
    return _offsets([memoryview(f).nbytes for f in frames])[1]


def write(frames: Sequence[Any], into: memoryview) -> None:
    """Lay ``frames`` out in ``into`` (``size_of(frames)`` bytes, zeroed: padding stays 0)."""
    views = [memoryview(f).cast("B") for f in frames]
    lengths = [v.nbytes for v in views]
    _HEAD.pack_into(into, 0, _MAGIC, len(views))
    for i, length in enumerate(lengths):
        _LENGTH.pack_into(into, _HEAD.size + i * _LENGTH.size, length)
    offsets, _ = _offsets(lengths)
    for view, at in zip(views, offsets, strict=True):
        into[at : at + view.nbytes] = view


def read(image: memoryview) -> p.Payload:
    """The payload in ``image``; its arrays are views on it."""
    image = image.cast("B") if image.format != "B" else image
    if image.nbytes < _HEAD.size:
        raise ImageError(f"{image.nbytes} bytes: too short for a payload image")
    magic, count = _HEAD.unpack_from(image, 0)
    if magic != _MAGIC or not 1 <= count <= _MAX_FRAMES:
        raise ImageError("not a payload image")
    table_end = _HEAD.size + count * _LENGTH.size
    if image.nbytes < table_end:
        raise ImageError("a payload image's frame table is cut short")
    lengths = [_LENGTH.unpack_from(image, _HEAD.size + i * _LENGTH.size)[0] for i in range(count)]
    offsets, end = _offsets(lengths)
    if end != image.nbytes:
        raise ImageError(f"a payload image of {image.nbytes} bytes lays out {end}")
    frames = [image[at : at + length] for at, length in zip(offsets, lengths, strict=True)]
    try:
        return p.payload_from_frames(frames)
    except p.ProtocolError as error:
        raise ImageError(str(error)) from None
