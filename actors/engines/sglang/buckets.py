"""A version's weights as flattened buckets: one flat tensor of one dtype, and where each
weight lies in it.

SGLang loads new weights from tensors handed to it in buckets (``load_format=
"flattened_bucket"``): each bucket is a single 1-D tensor and, per weight, its name,
shape, dtype and element range. Few large tensors cross the process boundary instead of
one per weight (hundreds of small handles for a real model), and each bucket's size is
bounded so that the copy to the device never needs more than ``max_bytes`` at once.

A flat tensor has one dtype, so weights are grouped by dtype first; within a dtype they
keep the state's order. A weight larger than ``max_bytes`` cannot be split (the engine
loads whole weights) and goes alone in a bucket of its own.

With tied word embeddings the output layer *is* the input embedding: it is sent once, as
``model.embed_tokens.weight`` (what a Hugging Face checkpoint stores and what SGLang's
models load), and :func:`rebuild` ties it again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

__all__ = [
    "EMBEDDING",
    "OUTPUT",
    "Bucket",
    "Entry",
    "build_buckets",
    "iter_buckets",
    "rebuild",
]

EMBEDDING = "model.embed_tokens.weight"
OUTPUT = "lm_head.weight"


@dataclass(frozen=True, slots=True)
class Entry:
    """One weight in a bucket: elements ``start:end`` of the flat tensor, reshaped."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start

    def fields(self) -> dict[str, object]:
        """The fields of SGLang's per-tensor metadata for this weight, by their names."""
        return {
            "name": self.name,
            "shape": torch.Size(self.shape),
            "dtype": self.dtype,
            "start_idx": self.start,
            "end_idx": self.end,
            "numel": self.numel,
        }


@dataclass(frozen=True, slots=True)
class Bucket:
    """Weights of one dtype, flattened into ``flat`` one after another."""

    flat: torch.Tensor
    entries: tuple[Entry, ...]

    @property
    def nbytes(self) -> int:
        return self.flat.numel() * self.flat.element_size()

    def tensors(self) -> dict[str, torch.Tensor]:
        """The weights, as views of ``flat`` (no copy)."""
        return {e.name: self.flat[e.start : e.end].view(e.shape) for e in self.entries}


def iter_buckets(
    state: Mapping[str, torch.Tensor], max_bytes: int, *, tied_embeddings: bool
) -> Iterator[Bucket]:
    """``state`` in buckets of at most ``max_bytes`` (a larger weight alone), made one at a
    time so that only one bucket's copy is alive while the caller sends it."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes}: expected >= 1")
    for group in _groups(_sent(state, tied_embeddings), max_bytes):
        yield _flatten(group)


def build_buckets(
    state: Mapping[str, torch.Tensor], max_bytes: int, *, tied_embeddings: bool
) -> list[Bucket]:
    """Every bucket of ``state`` at once (see :func:`iter_buckets`)."""
    return list(iter_buckets(state, max_bytes, tied_embeddings=tied_embeddings))


def rebuild(buckets: list[Bucket], *, tied_embeddings: bool) -> dict[str, torch.Tensor]:
    """The weights the buckets hold, by name: what the engine ends up loading."""
    state: dict[str, torch.Tensor] = {}
    for bucket in buckets:
        for name, tensor in bucket.tensors().items():
            if name in state:
                raise ValueError(f"weight {name!r} is in two buckets")
            state[name] = tensor
    if tied_embeddings and EMBEDDING in state:
        state[OUTPUT] = state[EMBEDDING]
    return state


# --- inside -------------------------------------------------------------------------------


def _sent(state: Mapping[str, torch.Tensor], tied: bool) -> list[tuple[str, torch.Tensor]]:
    """The weights to send, in order; the output layer once only, as the embedding."""
    if tied:
        if EMBEDDING not in state:
            raise ValueError(f"tied word embeddings, but the state has no {EMBEDDING!r}")
        return [(n, t) for n, t in state.items() if n != OUTPUT]
    if EMBEDDING in state and OUTPUT not in state:
        # Untied, the output layer is a weight of its own: without it the engine would keep
        # the old one and sample from a model that is no version at all.
        raise ValueError(f"untied word embeddings, but the state has no {OUTPUT!r}")
    return list(state.items())


def _groups(
    weights: list[tuple[str, torch.Tensor]], max_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in weights:
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    for group in by_dtype.values():
        current: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in group:
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > max_bytes:
                yield current
                current, size = [], 0
            current.append((name, tensor))
            size += nbytes
        if current:
            yield current


def _flatten(group: list[tuple[str, torch.Tensor]]) -> Bucket:
    entries, start = [], 0
    for name, tensor in group:
        end = start + tensor.numel()
        entries.append(Entry(name, tuple(tensor.shape), tensor.dtype, start, end))
        start = end
    # One copy into a fresh flat tensor: the state's tensors may be views of a receiver's
    # buffer, which is handed back for the next version as soon as loading ends.
    flat = torch.cat([tensor.reshape(-1) for _, tensor in group])
    return Bucket(flat, tuple(entries))
