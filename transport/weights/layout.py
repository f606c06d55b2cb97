"""One version's weights as one flat byte buffer: where each tensor lies, and its buckets.

The trainer copies its parameters into a flat buffer laid out by :func:`plan`; every
``bucket_bytes`` of it gets a CRC-32C. The :class:`Manifest` (layout, bucket checksums,
version) travels through the scheduler, apart from the bytes, so a receiver checks what
it got against a description that did not come down the same wire.

A receiver's flat buffer with the same layout *is* a state dict: :func:`views` gives
tensors over it without a copy.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import crc32c
import numpy as np
import torch

__all__ = [
    "ALIGN",
    "Manifest",
    "ManifestError",
    "TensorSpec",
    "bucket_checksums",
    "plan",
    "stage",
    "views",
]

ALIGN = 64  # every tensor starts on a cache line, so views are aligned for any dtype

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class ManifestError(ValueError):
    """A manifest that does not describe a usable buffer; says what is wrong."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Manifest:
    """Version ``version`` as ``total`` bytes: its tensors, and a CRC-32C per bucket."""

    version: int
    tensors: tuple[TensorSpec, ...]
    total: int
    bucket_bytes: int
    checksums: tuple[int, ...]

    @property
    def buckets(self) -> int:
        return len(self.checksums)

    def bucket_range(self, index: int) -> tuple[int, int]:
        start = index * self.bucket_bytes
        return start, min(self.total, start + self.bucket_bytes)

    def to_payload(self) -> dict[str, object]:
        return {
            "version": self.version,
            "total": self.total,
            "bucket_bytes": self.bucket_bytes,
            "checksums": list(self.checksums),
            "tensors": [[t.name, t.dtype, list(t.shape), t.offset, t.nbytes] for t in self.tensors],
        }

    @classmethod
    def from_payload(cls, payload: object) -> Manifest:
        """Parse and check a manifest that came over the wire."""
        if not isinstance(payload, dict):
            raise ManifestError(f"manifest must be a map, got {type(payload).__name__}")
        try:
            version, total = _integer(payload["version"]), _integer(payload["total"])
            bucket_bytes = _integer(payload["bucket_bytes"])
            checksums = tuple(_integer(c) for c in payload["checksums"])
            tensors = tuple(
                TensorSpec(str(n), str(d), tuple(_integer(x) for x in s), _integer(o), _integer(b))
                for n, d, s, o, b in payload["tensors"]
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ManifestError(f"manifest field missing or malformed: {error!r}") from None
        manifest = cls(version, tensors, total, bucket_bytes, checksums)
        manifest.check()
        return manifest

    def check(self) -> None:
        if self.version < 0 or self.total < 0 or self.bucket_bytes < 1:
            raise ManifestError(
                f"version {self.version}, total {self.total}, bucket_bytes {self.bucket_bytes}"
            )
        expected = -(-self.total // self.bucket_bytes)
        if len(self.checksums) != expected:
            raise ManifestError(
                f"{len(self.checksums)} checksums for {expected} buckets of {self.total} bytes"
            )
        for spec in self.tensors:
            if spec.dtype not in _DTYPES:
                raise ManifestError(f"tensor {spec.name!r}: unknown dtype {spec.dtype!r}")
            if any(d < 0 for d in spec.shape):
                raise ManifestError(f"tensor {spec.name!r}: negative dimension in {spec.shape}")
            # Exact, in Python integers: a NumPy product wraps around for huge shapes.
            size = _DTYPES[spec.dtype].itemsize * math.prod(spec.shape)
            if spec.nbytes != size:
                raise ManifestError(
                    f"tensor {spec.name!r}: {spec.nbytes} bytes, but shape {spec.shape} of "
                    f"{spec.dtype} is {size}"
                )
            if spec.offset % ALIGN:
                raise ManifestError(
                    f"tensor {spec.name!r}: offset {spec.offset} is not {ALIGN}-byte aligned"
                )
            if spec.offset < 0 or spec.offset + size > self.total:
                raise ManifestError(
                    f"tensor {spec.name!r}: bytes [{spec.offset}, {spec.offset + size}) "
                    f"out of bounds of the {self.total}-byte buffer"
                )


def _integer(value: object) -> int:
    """An integer field as sent; a float or a bool is malformed, not rounded."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r:.40}")
    return value


def plan(state: Mapping[str, torch.Tensor]) -> tuple[tuple[TensorSpec, ...], int]:
    """Where each tensor of ``state`` goes in a flat buffer, and the buffer's size."""
    specs, offset = [], 0
    for name, tensor in state.items():
        if tensor.dtype not in _NAMES:
            raise TypeError(f"tensor {name!r} has dtype {tensor.dtype}, which weights can't carry")
        nbytes = tensor.numel() * tensor.element_size()
        specs.append(TensorSpec(name, _NAMES[tensor.dtype], tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return tuple(specs), offset


def stage(
    state: Mapping[str, torch.Tensor],
    specs: tuple[TensorSpec, ...],
    buffer: np.ndarray,
    bucket_bytes: int,
    total: int,
) -> list[int]:
    """Copy ``state`` into ``buffer`` where ``specs`` say; the CRC-32C of every bucket.

    The trainer's one copy. It goes in pieces; a second thread checksums each piece
    while the next is copied (both release the GIL), so staging takes about as long as
    the copy alone rather than the copy plus a second pass over the bytes.
    """
    by_bucket = [0] * (-(-total // bucket_bytes))
    view = memoryview(buffer)
    pieces: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
    checker = threading.Thread(
        target=_checksum_pieces, args=(pieces, by_bucket, view, bucket_bytes), daemon=True
    )
    checker.start()
    end = 0
    try:
        for spec in specs:
            # As bytes, through NumPy: a plain memcpy, several times faster here than
            # torch's typed copy into a reinterpreted view.
            raw = state[spec.name].detach().contiguous().reshape(-1).view(torch.uint8).numpy()
            if spec.offset > end:  # alignment padding counts in its bucket's checksum
                buffer[end : spec.offset] = 0
                pieces.put((end, spec.offset))
            for start in range(0, spec.nbytes, _PIECE):
                stop = min(spec.nbytes, start + _PIECE)
                np.copyto(buffer[spec.offset + start : spec.offset + stop], raw[start:stop])
                pieces.put((spec.offset + start, spec.offset + stop))
            end = spec.offset + spec.nbytes
        if total > end:
            buffer[end:total] = 0
            pieces.put((end, total))
    finally:
        pieces.put(None)
        checker.join()
    return by_bucket


_PIECE = 4 << 20


def _checksum_pieces(
    pieces: queue.SimpleQueue[tuple[int, int] | None],
    crcs: list[int],
    view: memoryview,
    bucket_bytes: int,
) -> None:
    """Extend each bucket's running CRC with the pieces, in the order they were copied."""
    while (piece := pieces.get()) is not None:
        start, stop = piece
        while start < stop:
            index = start // bucket_bytes
            edge = min(stop, (index + 1) * bucket_bytes)
            crcs[index] = crc32c.crc32c(view[start:edge], crcs[index])
            start = edge


def bucket_checksums(buffer: np.ndarray, total: int, bucket_bytes: int) -> Iterator[int]:
    """CRC-32C of each bucket of ``buffer[:total]``, in order."""
    view = memoryview(buffer)
    for start in range(0, total, bucket_bytes):
        yield crc32c.crc32c(view[start : min(total, start + bucket_bytes)])


def views(buffer: np.ndarray, specs: tuple[TensorSpec, ...]) -> dict[str, torch.Tensor]:
    """The tensors ``specs`` describe, as views of ``buffer`` (no copy)."""
    flat = torch.from_numpy(buffer)
    out = {}
    for spec in specs:
        dtype = _DTYPES[spec.dtype]
        out[spec.name] = flat[spec.offset : spec.offset + spec.nbytes].view(dtype).view(spec.shape)
    return out
