"""Which staging buffer may be written, and which read: the dual-buffer rules, pure.

Each side of a transfer owns two flat CPU buffers (slots). A writer (the trainer staging
a version, or a receiver fetching one) fills one slot while readers (receivers pulling
from the trainer, or from a relay) read the other, so nobody waits for a slow reader of
the previous version. The rules that keep that safe:

- a slot is never written while anyone reads it: the writer first *revokes* it (no new
  readers; the owner cancels the reads in flight, which then close) and writes once the
  last reader is gone;
- the newest complete version is never overwritten, so there is always one to serve;
- a pinned slot (a receiver's model runs on it) is never written;
- a slot being written may be read up to the bytes already verified, which is how a
  relay forwards a version while it is still arriving; anything else is never exposed.

No locks and no clock here: the owner serialises calls (one lock) and does the I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["BufferPool", "Grant", "Revoke", "SlotState"]


class SlotState(enum.Enum):
    FREE = "free"
    WRITING = "writing"
    READY = "ready"
    REVOKED = "revoked"  # being emptied of readers so that it can be written


@dataclass(slots=True)
class _Slot:
    state: SlotState = SlotState.FREE
    version: int | None = None
    readers: int = 0
    verified: int = 0  # bytes from the start that hold ``version``'s checked content
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class Grant:
    """Write ``version`` into ``slot`` now."""

    slot: int


@dataclass(frozen=True, slots=True)
class Revoke:
    """Cancel the reads of ``slot`` in flight, then ask again."""

    slot: int


class BufferPool:
    def __init__(self, count: int = 2) -> None:
        if count < 2:
            raise ValueError(f"{count} buffers: a writer and a reader need two")
        self._slots = [_Slot() for _ in range(count)]

    # --- the writer ------------------------------------------------------------------

    def start_write(self, version: int) -> Grant | Revoke | None:
        """Where ``version`` may be written; None if every slot must be kept.

        Prefers a free slot, then the oldest ready one; never the newest complete version
        or a pinned slot. A slot with readers is revoked first.
        """
        newest = self.newest()
        candidates = [
            i
            for i, s in enumerate(self._slots)
            if not s.pinned and s.state is not SlotState.WRITING and i != newest
        ]
        if not candidates:
            return None
        index = min(
            candidates,
            key=lambda i: (
                self._slots[i].state is not SlotState.FREE,
                self._slots[i].version or -1,
            ),
        )
        slot = self._slots[index]
        if slot.readers:
            slot.state = SlotState.REVOKED
            return Revoke(index)
        slot.state, slot.version, slot.verified = SlotState.WRITING, version, 0
        return Grant(index)

    def verified(self, index: int, nbytes: int) -> None:
        """The first ``nbytes`` of the slot being written are checked; readers may have them."""
        slot = self._writing(index)
        if nbytes < slot.verified:
            raise ValueError(
                f"slot {index}: verified bytes go back from {slot.verified} to {nbytes}"
            )
        slot.verified = nbytes

    def finish_write(self, index: int) -> None:
        """The slot holds its version whole."""
        self._writing(index).state = SlotState.READY

    def abort_write(self, index: int) -> None:
        """The write failed: the slot holds nothing usable (readers of partial bytes go on)."""
        slot = self._writing(index)
        slot.state = SlotState.REVOKED if slot.readers else SlotState.FREE
        slot.version, slot.verified = None, 0

    # --- readers ---------------------------------------------------------------------

    def open_read(self, version: int) -> int | None:
        """A slot from which ``version`` may be read (up to :meth:`readable`), or None."""
        for index, slot in enumerate(self._slots):
            if slot.version == version and slot.state in (SlotState.READY, SlotState.WRITING):
                slot.readers += 1
                return index
        return None

    def readable(self, index: int, version: int) -> int | None:
        """Bytes of ``version`` a reader of ``index`` may take now; None if it must stop."""
        slot = self._slots[index]
        if slot.version != version or slot.state not in (SlotState.READY, SlotState.WRITING):
            return None
        return slot.verified

    def close_read(self, index: int) -> None:
        slot = self._slots[index]
        if slot.readers == 0:
            raise ValueError(f"slot {index} has no reader to close")
        slot.readers -= 1
        if slot.readers == 0 and slot.state is SlotState.REVOKED:
            slot.state, slot.version, slot.verified = SlotState.FREE, None, 0

    # --- a receiver's model ----------------------------------------------------------

    def pin(self, index: int) -> None:
        """The model now runs on this slot's bytes: never write it; unpin every other."""
        if self._slots[index].state is not SlotState.READY:
            raise ValueError(f"slot {index} is {self._slots[index].state.value}, not ready")
        for i, slot in enumerate(self._slots):
            slot.pinned = i == index

    # --- what the owner reads --------------------------------------------------------

    def newest(self) -> int | None:
        """The slot with the newest complete version."""
        ready = [(s.version, i) for i, s in enumerate(self._slots) if s.state is SlotState.READY]
        return max(ready)[1] if ready else None

    def revoked(self) -> list[int]:
        """Slots whose readers the owner must cancel."""
        return [i for i, s in enumerate(self._slots) if s.state is SlotState.REVOKED and s.readers]

    def state(self, index: int) -> tuple[SlotState, int | None, int, int, bool]:
        s = self._slots[index]
        return s.state, s.version, s.readers, s.verified, s.pinned

    def __len__(self) -> int:
        return len(self._slots)

    def _writing(self, index: int) -> _Slot:
        slot = self._slots[index]
        if slot.state is not SlotState.WRITING:
            raise ValueError(f"slot {index} is {slot.state.value}, not being written")
        return slot
