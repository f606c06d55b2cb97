"""The order training rows are taken in: a seeded shuffle per epoch, a pure function of
(seed, epoch, number of rows), so a restarted dataloader takes exactly the same rows.

The dataloader keys group ``index`` as ``train-{index:09d}`` and, after a restart,
offers keys from 0 again for the scheduler to skip the ones it holds; that works only
because ``row(index)`` never changes. Epoch ``e`` is indexes ``e*n .. e*n+n-1``, each
row once, in its own shuffle. The shuffle sorts rows by a keyed hash, not by a library's
random stream, so another Python or NumPy version resumes a run in the same order.

A mixture (``data.train_weights``) splits the rows into weighted parts: index -> (part,
position in that part) by a deterministic interleave, then position -> row by the part's
own :class:`ShuffledOrder`, so each part's epochs come and go at its own pace and the
whole is still a function of (seed, index) alone. The interleave splits the parts into
two halves, and the halves again, down to single parts; at each split the first ``n``
indexes reaching it send ``round(n * share)`` to the first half (halves rounded up), the
rest to the second. So any run of consecutive indexes gives each part its share to
within one index per level of splitting: with two parts, ``floor`` or ``ceil`` of it
(1,000 prompts at 3:1 are 750 and 250 exactly); with up to four parts, within two.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["MixedOrder", "Order", "Part", "ShuffledOrder"]


class ShuffledOrder:
    """Which of ``size`` rows the ``index``-th training group takes. ``salt`` keeps the
    shuffles of a mixture's parts apart (two parts of one size are not shuffled alike)."""

    def __init__(self, size: int, seed: int, salt: str = "") -> None:
        if size < 1:
            raise ValueError(f"size {size}: expected at least one row")
        self.size, self.seed = size, seed
        # A salt of any length, as 16 hex digits: blake2b takes keys of 64 bytes at most.
        salted = hashlib.blake2b(salt.encode(), digest_size=8).hexdigest() if salt else ""
        self._key = f"{seed}:{salted}:" if salt else f"{seed}:"
        self._epoch, self._permutation = -1, list[int]()

    def row(self, index: int) -> int:
        if index < 0:
            raise ValueError(f"index {index}: expected an integer >= 0")
        epoch, position = divmod(index, self.size)
        if epoch != self._epoch:  # the dataloader reads forward: keep one epoch's order
            self._epoch, self._permutation = epoch, self.permutation(epoch)
        return self._permutation[position]

    def permutation(self, epoch: int) -> list[int]:
        """Epoch ``epoch``'s order: every row once."""
        key = f"{self._key}{epoch}".encode()
        return sorted(range(self.size), key=lambda row: _hash(key, row))


@dataclass(frozen=True)
class Part:
    """One weighted part of a mixture: its name (a file or a data source), its weight,
    and its rows (indexes into the whole training list)."""

    name: str
    weight: float
    rows: Sequence[int]


class MixedOrder:
    """Which training row the ``index``-th group takes when the rows fall into weighted
    parts: each part its share of every run of indexes, its rows in its own shuffle."""

    def __init__(self, parts: Sequence[Part], seed: int) -> None:
        if not parts:
            raise ValueError("a mixture needs at least one part")
        for part in parts:
            if not 0 < part.weight < math.inf:
                raise ValueError(
                    f"part {part.name!r}: weight {part.weight}; expected a finite number > 0"
                )
        self.parts = tuple(parts)
        self._orders = [ShuffledOrder(len(p.rows), seed, salt=p.name) for p in parts]
        # Exact fractions of the weights as given, so the split of index n never depends
        # on rounding in floating point.
        weights = [Fraction(p.weight) for p in parts]
        self._shares: dict[tuple[int, int], Fraction] = {}
        self._share_of_first_half(weights, 0, len(parts))

    def _share_of_first_half(self, weights: list[Fraction], lo: int, hi: int) -> None:
        if hi - lo < 2:
            return
        mid = (lo + hi) // 2
        self._shares[lo, hi] = sum(weights[lo:mid]) / sum(weights[lo:hi])
        self._share_of_first_half(weights, lo, mid)
        self._share_of_first_half(weights, mid, hi)

    def row(self, index: int) -> int:
        part, position = self.locate(index)
        return self.parts[part].rows[self._orders[part].row(position)]

    def locate(self, index: int) -> tuple[int, int]:
        """(part, position within it) of group ``index``: the part's ``position``-th draw."""
        if index < 0:
            raise ValueError(f"index {index}: expected an integer >= 0")
        lo, hi = 0, len(self.parts)
        while hi - lo > 1:
            mid, share = (lo + hi) // 2, self._shares[lo, hi]
            first_before = _rounded(index, share)
            if _rounded(index + 1, share) > first_before:
                hi, index = mid, first_before
            else:
                lo, index = mid, index - first_before
        return lo, index

    def counts(self, stop: int) -> list[int]:
        """How many of the indexes ``0 .. stop-1`` each part takes."""
        counts = [0] * len(self.parts)

        def split(n: int, lo: int, hi: int) -> None:
            if hi - lo == 1:
                counts[lo] = n
                return
            mid, first = (lo + hi) // 2, _rounded(n, self._shares[lo, hi])
            split(first, lo, mid)
            split(n - first, mid, hi)

        split(stop, 0, len(self.parts))
        return counts


Order = ShuffledOrder | MixedOrder


def _rounded(n: int, share: Fraction) -> int:
    """``n * share`` rounded half up, in integers."""
    return (2 * n * share.numerator + share.denominator) // (2 * share.denominator)


def _hash(key: bytes, row: int) -> bytes:
    return hashlib.blake2b(row.to_bytes(8, "little"), key=key, digest_size=8).digest()
