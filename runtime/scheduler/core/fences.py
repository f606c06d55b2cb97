"""Fencing tokens that cannot be guessed from lease ids, and still never repeat.

The core counts fences (``CoreState.fence``: one per lease or lock granted, the epoch in
the high bits so that a restart never reissues a number lost with the journal's tail).
What goes on the wire is not the count but a keyed permutation of it: a four-round
Feistel network over 62 bits whose round function is BLAKE2b keyed with a run secret.
Being a permutation, distinct counts give distinct tokens, so the epoch rule still holds
exactly; being keyed, a client that knows a lease id (or every fence it was ever given)
learns nothing about another lease's token.

The key comes in with the settings (the core reads no clock and draws no randomness), so
a resumed scheduler given the same key rebuilds the same tokens from its journal. An
empty key is the identity: the count itself, which the core's unit tests rely on.
"""

from __future__ import annotations

import hashlib

__all__ = ["FENCE_BITS", "FenceCipher"]

_HALF = 31
_MASK = (1 << _HALF) - 1
FENCE_BITS = 2 * _HALF  # counts (epoch << 32 | n) stay below 2**62 for 2**30 restarts
_ROUNDS = 4


class FenceCipher:
    """``token(count)``: the fence the wire carries for the ``count``-th grant."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes = b"") -> None:
        if len(key) > 64:  # BLAKE2b's key limit; longer keys are hashed down
            key = hashlib.blake2b(key).digest()
        self._key = key

    def token(self, count: int) -> int:
        if not self._key:
            return count
        if not 0 <= count < 1 << FENCE_BITS:
            raise ValueError(f"fence count {count} outside [0, 2**{FENCE_BITS})")
        left, right = count >> _HALF, count & _MASK
        for round_ in range(_ROUNDS):
            left, right = right, left ^ self._round(round_, right)
        return left << _HALF | right

    def _round(self, round_: int, half: int) -> int:
        data = bytes((round_,)) + half.to_bytes(4, "little")
        digest = hashlib.blake2b(data, key=self._key, digest_size=4).digest()
        return int.from_bytes(digest, "little") & _MASK

    def __repr__(self) -> str:  # never the key
        return f"FenceCipher(keyed={bool(self._key)})"
