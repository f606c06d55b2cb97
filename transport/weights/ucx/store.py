"""A node's two staging buffers with the pool's rules, under one lock and condition."""

from __future__ import annotations

import threading

import numpy as np

from ..buffers import BufferPool, Grant

__all__ = ["Store"]


class Store:
    def __init__(self) -> None:
        self.pool = BufferPool(2)
        self.buffers: list[np.ndarray | None] = [None] * len(self.pool)
        self.changed = threading.Condition()  # guards pool and buffers; notified on change

    def claim(self, version: int, stop: threading.Event | None = None) -> int | None:
        """A slot to write ``version`` into, once its readers are cancelled (by the server).

        Waits while every slot must be kept (a receiver's model has not yet taken its
        newest version); None if ``stop`` is set meanwhile.
        """
        with self.changed:
            while True:
                decision = self.pool.start_write(version)
                if isinstance(decision, Grant):
                    return decision.slot
                self.changed.notify_all()  # revoked or kept: the server cancels, a model moves
                if stop is not None and stop.is_set():
                    return None
                self.changed.wait(0.01)

    def buffer(self, slot: int, nbytes: int) -> np.ndarray:
        """The slot's buffer, at least ``nbytes`` long, its pages touched once.

        Touching the pages at allocation keeps page faults out of every later copy
        (a fresh buffer copies at about half the speed of a warm one here).
        """
        current = self.buffers[slot]
        if current is None or current.size < nbytes:
            current = np.empty(nbytes, np.uint8)
            current.fill(0)
            self.buffers[slot] = current
        return current
