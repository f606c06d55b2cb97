"""The books of the decoder's kept caches: which free slot still holds which finished
sequence's keys and values, and which of them a new prompt shares the longest prefix with.

A sequence that asks for it (``Request.keep_cache``: a conversation's turn, which the next
turn extends) leaves its cached prefix in its slot when it ends. The slot is free all the
same: a new sequence takes it when it needs it, and the kept prefix then moves to an empty
slot, or the least recently used kept prefix makes room. The tensors are the decoder's
to copy; this module only says where things are.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

__all__ = ["Kept", "KeptCaches", "common_prefix"]


@dataclass(eq=False)  # one is itself only: the decoder spares some by identity
class Kept:
    """A finished sequence's cached tokens, still in its slot."""

    tokens: np.ndarray  # int64: the tokens whose keys and values the slot holds, in order
    routes: np.ndarray | None  # their experts (a decoder that records routes), else None
    used: int  # when it was kept or last reused: the least recent goes first


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class KeptCaches:
    """Slot → the sequence kept there. Reuse takes at least ``min_tokens`` shared tokens."""

    def __init__(self, min_tokens: int) -> None:
        if min_tokens < 1:
            raise ValueError(f"reuse_min_tokens={min_tokens}: expected >= 1")
        self.min_tokens = min_tokens
        self.slots: dict[int, Kept] = {}
        self._clock = itertools.count()

    def __len__(self) -> int:
        return len(self.slots)

    def __contains__(self, slot: int) -> bool:
        return slot in self.slots

    def keep(self, slot: int, tokens: np.ndarray, routes: np.ndarray | None) -> None:
        """Keep ``tokens``' cache in ``slot``; a kept one they begin with goes (the same
        conversation's earlier turn: whatever would reuse it reuses these as well)."""
        covered = [
            other
            for other, kept in self.slots.items()
            if common_prefix(kept.tokens, tokens) == len(kept.tokens)
        ]
        for other in covered:
            del self.slots[other]
        self.slots[slot] = Kept(tokens, routes, next(self._clock))

    def touch(self, slot: int) -> None:
        self.slots[slot].used = next(self._clock)

    def pop(self, slot: int) -> Kept:
        return self.slots.pop(slot)

    def move(self, source: int, target: int) -> None:
        self.slots[target] = self.slots.pop(source)

    def clear(self) -> None:
        self.slots.clear()

    def best(self, prompt: np.ndarray, prefer: Collection[int] = ()) -> tuple[int, int] | None:
        """The slot whose tokens share the longest prefix with ``prompt``, and that prefix's
        length (one of the slots ``prefer`` on a tie: their rows need no copy), if it is
        at least ``min_tokens``; None otherwise."""
        found, longest = None, self.min_tokens - 1
        for slot, kept in self.slots.items():
            shared = common_prefix(kept.tokens, prompt)
            tie = shared == longest and found is not None and slot in prefer
            if shared > longest or tie:
                found, longest = slot, shared
        return None if found is None else (found, longest)

    def least_used(self, sparing: Collection[int] = ()) -> int | None:
        """The slot kept longest without reuse, ``sparing`` those slots; None if none."""
        left = [(kept.used, slot) for slot, kept in self.slots.items() if slot not in sparing]
        return min(left)[1] if left else None
