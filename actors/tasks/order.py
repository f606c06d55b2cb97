"""The order training rows are taken in: a seeded shuffle per epoch, a pure function of
(seed, epoch, number of rows), so a restarted dataloader takes exactly the same rows.

The dataloader keys group ``index`` as ``train-{index:09d}`` and, after a restart,
offers keys from 0 again for the scheduler to skip the ones it holds; that works only
because ``row(index)`` never changes. Epoch ``e`` is indexes ``e*n .. e*n+n-1``, each
row once, in its own shuffle. The shuffle sorts rows by a keyed hash, not by a library's
random stream, so another Python or NumPy version resumes a run in the same order.
"""

from __future__ import annotations

import hashlib

__all__ = ["ShuffledOrder"]


class ShuffledOrder:
    """Which of ``size`` rows the ``index``-th training group takes."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError(f"size {size}: expected at least one row")
        self.size, self.seed = size, seed
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
        key = f"{self.seed}:{epoch}".encode()
        return sorted(range(self.size), key=lambda row: _hash(key, row))


def _hash(key: bytes, row: int) -> bytes:
    return hashlib.blake2b(row.to_bytes(8, "little"), key=key, digest_size=8).digest()
