"""Slot files behind a UCX publisher's two staging buffers, so that its host can map them.

With ``weights.map_on_host`` the UCX publisher stages each version into a slot file in
/dev/shm instead of private memory. Receivers on other hosts fetch it over UCX as before;
generators on the publisher's host map the file and run on it, as with ``shm``, so
nobody on the host copies a version twice.

The publisher's buffer pool decides which of its two slots a version goes to (it never
takes the slot of the newest version, and it cancels UCX readers of the slot it takes).
A generator may still run on the file behind that slot, under its shared lock: then the
slot moves to another file (a spare that nobody holds any more, or a new one), and the
held one stays as it is until the generator lets go. So the publisher never waits for a
generator, and a generator's bytes never change under it.

When /dev/shm has no room for a version (a container's 64 MiB, say), the slot is staged
in private memory: UCX serves it to everyone, and the announcement names no file.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import structlog

from .slot_file import NoSpace, SlotFile, encode_address, new_slot_paths

__all__ = ["StagingFiles"]

log = structlog.get_logger("asyncrl.weights")


class StagingFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._paths = new_slot_paths(directory)
        self.address = encode_address(directory)
        self._by_slot: dict[int, SlotFile] = {}
        self._spare: list[SlotFile] = []  # files generators held when their slot moved on
        self._warned_no_space = False

    @property
    def files(self) -> int:
        return len(self._by_slot) + len(self._spare)

    def writable(self, slot: int, nbytes: int) -> np.ndarray | None:
        """A buffer of ``nbytes`` in a file for ``slot`` that nobody reads, locked for
        writing; None if /dev/shm cannot hold it (stage in private memory then)."""
        current = self._by_slot.pop(slot, None)
        if current is not None and not current.try_lock():
            self._spare.append(current)  # a generator runs on it: leave it be
            current = None
        if current is None:
            current = self._free_spare()
        if current is None:
            first = self.files == 0
            current = self._new_file(nbytes)
            if current is None:
                return None
            if first:
                # The other slot's file too, now: made later, its gigabytes of page
                # allocation would land in the middle of the second version's transfer.
                spare = self._new_file(nbytes)
                if spare is not None:
                    spare.abandon()  # made locked; nobody's until a slot takes it
                    self._spare.append(spare)
            elif self.files >= 2:
                log.info("weight slot files grew", files=self.files + 1)
        self._by_slot[slot] = current
        try:
            return current.begin(nbytes)
        except NoSpace as error:
            log.warning("staging weights in private memory", reason=str(error))
            self._by_slot.pop(slot).abandon()
            self._spare.append(current)
            return None

    def finish(self, slot: int, version: int, nbytes: int) -> dict[str, object]:
        """``slot``'s file holds ``version`` whole; what a manifest needs to map it."""
        file = self._by_slot[slot]
        file.finish(version, nbytes)
        return {"file": file.name, "shm": self.address}

    def abandon(self, slot: int) -> None:
        file = self._by_slot.get(slot)
        if file is not None:
            file.abandon()

    def close(self) -> None:
        for file in [*self._by_slot.values(), *self._spare]:
            file.remove()
        self._by_slot.clear()
        self._spare.clear()
        # Not empty while a generator holds a file of a trainer before this one.
        with contextlib.suppress(OSError):
            self.directory.rmdir()

    def _new_file(self, nbytes: int) -> SlotFile | None:
        try:
            return SlotFile(next(self._paths), nbytes)
        except NoSpace as error:
            if not self._warned_no_space:
                log.warning("staging weights in private memory", reason=str(error))
                self._warned_no_space = True
            return None

    def _free_spare(self) -> SlotFile | None:
        for index, file in enumerate(self._spare):
            if file.try_lock():
                return self._spare.pop(index)
        return None
