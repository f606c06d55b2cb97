"""A node's two staging buffers with the pool's rules, under one lock and condition.

A publisher may back its buffers with slot files (``files``), so that generators on its
host map them instead of fetching; everyone else's buffers are private memory.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..buffers import BufferPool, Grant

if TYPE_CHECKING:
    from ..shm.staging_files import StagingFiles

__all__ = ["Store"]


class Store:
    def __init__(self, files: StagingFiles | None = None) -> None:
        self.pool = BufferPool(2)
        self.files = files
        self.buffers: list[np.ndarray | None] = [None] * len(self.pool)
        self.in_file = [False] * len(self.pool)  # whether a slot's buffer maps a slot file
        self.changed = threading.Condition()  # guards pool and buffers; notified on change
        # The version this node is about to fetch: requests for it wait instead of GONE,
        # so a relay planned before its own fetch began does not look failed.
        self.expecting: int | None = None

    def claim(
        self,
        version: int,
        nbytes: int,
        stop: threading.Event | None = None,
        deadline: float | None = None,
    ) -> int | None:
        """A slot of ``nbytes`` to write ``version`` into, once its readers are cancelled.

        Waits while every slot must be kept (a receiver's model has not yet taken its
        newest version); None if ``stop`` is set meanwhile, or once the monotonic clock
        passes ``deadline``: a wait that nothing ends must not hold a fetch for good. The
        buffer is sized in the same breath as the grant, so a reader never finds the slot
        with a stale buffer.
        """
        with self.changed:
            while True:
                decision = self.pool.start_write(version)
                if isinstance(decision, Grant):
                    self.buffer(decision.slot, nbytes)
                    return decision.slot
                self.changed.notify_all()  # revoked or kept: the server cancels, a model moves
                if stop is not None and stop.is_set():
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                self.changed.wait(0.01)

    def slots(self) -> str:
        """What each slot holds, for a message that says why none could be written."""
        described = []
        for index in range(len(self.pool)):
            state, version, readers, _, pinned = self.pool.state(index)
            pin = ", the model's" if pinned else ""
            described.append(f"{index}: {state.value} v{version} ({readers} readers{pin})")
        return "; ".join(described)

    def buffer(self, slot: int, nbytes: int) -> np.ndarray:
        """The slot's buffer, at least ``nbytes`` long, its pages touched once.

        Touching the pages at allocation keeps page faults out of every later copy
        (a fresh buffer copies at about half the speed of a warm one here). With slot
        files, the slot gets a file nobody maps (see StagingFiles), or private memory if
        /dev/shm is full; never a file's map again, which a generator may be running on.
        """
        was_in_file = self.in_file[slot]
        if self.files is not None:
            mapped = self.files.writable(slot, nbytes)
            self.in_file[slot] = mapped is not None
            if mapped is not None:
                self.buffers[slot] = mapped
                return mapped
        current = self.buffers[slot]
        if current is None or current.size < nbytes or was_in_file:
            current = np.empty(nbytes, np.uint8)
            # Through torch, which lets go of the GIL while it writes (NumPy's fill does
            # not): a receiver's decode loop keeps running meanwhile.
            torch.from_numpy(current).zero_()
            self.buffers[slot] = current
        return current
