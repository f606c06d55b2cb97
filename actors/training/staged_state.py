"""A trainer rank's state after each step, staged in host shared memory to outlive it.

Two slot files per rank (:mod:`.state_slot`), written in turn: a step goes into the
slot that does not hold the state the rank is at, so the newest staged state is never
overwritten while it is the only one, and a kill during a write leaves the other slot
whole. A trainer restarted on the same host (same run directory) finds both and
restores the one its step count asks for (:mod:`.resume`).

The directory is the run's own, in RAM-backed /dev/shm (``RunDir.staged_state``), open to
its owner only. Each rank stages its own shard (never a gather), so a group of N ranks
keeps 2N files. They are removed when the run's last step is done and its trainer stops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import structlog
import torch

from asyncrl.transport.host import private_directory

from .state_slot import Entry, SlotFile, checksum, layout

__all__ = ["Staged", "StagedState"]

log = structlog.get_logger("asyncrl.train")

_SLOTS = ("a", "b")


class Staged:
    """One verified slot: its step, what it was made with, and its tensors (read lazily)."""

    def __init__(
        self, slot: SlotFile, step: int, meta: dict, entries: tuple[Entry, ...], crc: int
    ) -> None:
        self.slot, self.step, self.meta, self.entries = slot, step, meta, entries
        self.checksum = crc  # recorded with the step: the one logged when it was staged

    def matches(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """Whether ``tensors`` are bit for bit this slot's (a state taken up from it)."""
        return checksum(tensors, self.entries, self.meta) == self.checksum

    def tensors(self) -> dict[str, torch.Tensor]:
        """CPU views of the slot's bytes: copy them out before the slot is written again."""
        table_len = self.slot.table_len()
        return {e.name: self.slot.tensor(e, table_len) for e in self.entries}


class StagedState:
    """This rank's two slots in ``directory``: stage a step, find staged steps, clean up."""

    def __init__(self, directory: Path, rank: int, identity: Mapping[str, object]) -> None:
        """``identity``: what a slot must have been made with to be used (the group size,
        this rank), so a state from another layout is never loaded into this one."""
        private_directory(directory, "holds a trainer's state")
        self.directory = directory
        self.identity = {**identity, "rank": rank}
        self.slots = [SlotFile(directory / f"rank{rank}-{name}.state") for name in _SLOTS]
        self._entries: tuple[Entry, ...] | None = None
        self._current: SlotFile | None = None  # the slot holding the state the rank is at

    def staged(self) -> dict[int, Staged]:
        """The steps this rank has staged whole (checksums checked), by step."""
        found: dict[int, Staged] = {}
        for slot in self.slots:
            checked = slot.verified()
            if checked is None:
                continue
            step, meta, entries, crc = checked
            if {k: meta.get(k) for k in self.identity} != self.identity:
                log.warning("a staged state of another group layout ignored", meta=meta)
                continue
            found[step] = Staged(slot, step, meta, entries, crc)
        return found

    def at(self, staged: Staged | None) -> None:
        """The rank's state is now ``staged``'s (restored from it), or none of the slots'."""
        self._current = None if staged is None else staged.slot

    def reserve(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Size both files for this state now, so a lack of room shows at start."""
        self._entries = layout(tensors)
        for slot in self.slots:
            slot.reserve(self._entries, self.identity)

    def save(self, step: int, tensors: Mapping[str, torch.Tensor]) -> int:
        """Stage ``tensors`` as ``step``'s state, in the slot not holding the current one;
        the checksum recorded."""
        if self._entries is None or {e.name for e in self._entries} != tensors.keys():
            self.reserve(tensors)  # the first step, or a state of other tensors
        assert self._entries is not None
        target = self.slots[1] if self._current is self.slots[0] else self.slots[0]
        if self._current is None:  # neither holds this rank's state: overwrite the older
            target = min(self.slots, key=lambda s: -1 if s.step() is None else s.step())
        crc = target.write(step, tensors, self._entries, self.identity)
        self._current = target
        return crc

    def remove(self) -> None:
        """The run ended: remove this rank's files, and the directory once it is empty."""
        for slot in self.slots:
            slot.remove()
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # other ranks' files still in it: the last one removes it

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
