"""The dual-buffer rules against a plain model of who reads and writes which bytes.

The machine plays a writer (versions in increasing order), readers and a receiver's
model, in random order, on a :class:`BufferPool`. Beside the pool it keeps what is
physically in each slot, ``(version, bytes written)``, and checks after every step
that a reader is only ever let at bytes of the version it opened, that the newest
complete version and a pinned slot are never handed to the writer, and that the pool's
own view of each slot agrees with the model.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from asyncrl.transport.weights.buffers import BufferPool, Grant, Revoke, SlotState

PICK = st.integers(0, 1 << 16)  # an index into whatever is there to pick from


class BufferPoolMachine(RuleBasedStateMachine):
    count = 2

    def __init__(self) -> None:
        super().__init__()
        self.pool = BufferPool(self.count)
        self.next_version = 0
        self.writing: dict[int, int] = {}  # slot -> version being written
        self.complete: dict[int, int] = {}  # slot -> version held whole and servable
        self.revoked: set[int] = set()  # slots being emptied of readers
        self.verified: dict[int, int] = {}  # slot -> bytes of its version checked
        self.content: dict[int, tuple[int, int]] = {}  # slot -> (version, bytes written)
        self.pinned: int | None = None
        self.readers: list[tuple[int, int]] = []  # open reads: (slot, version)
        self.finished_once = False

    # --- the model's reading of itself ---------------------------------------------------

    def readers_on(self, slot: int) -> int:
        return sum(1 for s, _ in self.readers if s == slot)

    def newest(self) -> int | None:
        ready = [(v, s) for s, v in self.complete.items()]
        return max(ready)[1] if ready else None

    def free(self) -> list[int]:
        return [
            s
            for s in range(self.count)
            if s not in self.writing and s not in self.complete and s not in self.revoked
        ]

    def servable(self, slot: int, version: int) -> int | None:
        """Bytes of ``version`` a reader of ``slot`` may take, by the model."""
        if self.writing.get(slot) == version or self.complete.get(slot) == version:
            return self.verified[slot]
        return None

    # --- the writer --------------------------------------------------------------------

    @rule()
    def start_write(self) -> None:
        version, newest = self.next_version, self.newest()
        decision = self.pool.start_write(version)
        if decision is None:
            for s in range(self.count):
                assert s in self.writing or s == self.pinned or s == newest, (
                    f"refused {version} with slot {s} writable"
                )
            return
        slot = decision.slot
        assert slot not in self.writing, f"slot {slot} handed out while being written"
        assert slot != self.pinned, f"pinned slot {slot} handed to the writer"
        assert slot != newest, f"slot {slot} holds the newest complete version"
        if isinstance(decision, Revoke):
            assert self.readers_on(slot), f"slot {slot} revoked with no readers"
            self.complete.pop(slot, None)
            self.revoked.add(slot)
            return
        assert isinstance(decision, Grant)
        assert self.readers_on(slot) == 0, f"slot {slot} granted with readers in it"
        if self.free():
            assert slot in self.free(), f"slot {slot} granted over free {self.free()}"
        self.complete.pop(slot, None)
        self.revoked.discard(slot)
        self.writing[slot] = version
        self.verified[slot] = 0
        self.content[slot] = (version, 0)
        self.next_version += 1

    @precondition(lambda self: self.writing)
    @rule(pick=PICK, more=st.integers(0, 300), unchecked=st.integers(0, 100))
    def verified_bytes(self, pick: int, more: int, unchecked: int) -> None:
        slot = sorted(self.writing)[pick % len(self.writing)]
        version, written = self.content[slot]
        # The writer lays bytes down ahead of what it has checked; readers must not see those.
        checked = self.verified[slot] + more
        self.content[slot] = (version, max(written, checked + unchecked))
        self.pool.verified(slot, checked)
        self.verified[slot] = checked

    @precondition(lambda self: any(self.verified.get(s, 0) for s in self.writing))
    @rule(pick=PICK)
    def verified_bytes_never_go_back(self, pick: int) -> None:
        slots = sorted(s for s in self.writing if self.verified[s])
        slot = slots[pick % len(slots)]
        with pytest.raises(ValueError, match="go back"):
            self.pool.verified(slot, self.verified[slot] - 1)

    @precondition(lambda self: self.writing)
    @rule(pick=PICK)
    def finish_write(self, pick: int) -> None:
        slot = sorted(self.writing)[pick % len(self.writing)]
        self.pool.finish_write(slot)
        self.complete[slot] = self.writing.pop(slot)
        self.finished_once = True

    @precondition(lambda self: self.writing)
    @rule(pick=PICK)
    def abort_write(self, pick: int) -> None:
        slot = sorted(self.writing)[pick % len(self.writing)]
        self.pool.abort_write(slot)
        del self.writing[slot]
        if self.readers_on(slot):
            self.revoked.add(slot)

    @rule(slot=st.integers(0, 2))
    def only_a_slot_being_written_takes_writes(self, slot: int) -> None:
        if slot >= self.count or slot in self.writing:
            return
        for call in (
            lambda: self.pool.verified(slot, 0),
            lambda: self.pool.finish_write(slot),
            lambda: self.pool.abort_write(slot),
        ):
            with pytest.raises(ValueError, match="not being written"):
                call()

    # --- readers ---------------------------------------------------------------------

    @rule(back=st.integers(0, 3))
    def open_read(self, back: int) -> None:
        version = self.next_version - back  # recent versions, and one not yet written
        slot = self.pool.open_read(version)
        held = [s for s in range(self.count) if self.servable(s, version) is not None]
        if slot is None:
            assert not held, f"version {version} is in slot {held} but no read was opened"
            return
        assert slot in held, f"read of {version} opened on slot {slot}, which holds {held}"
        self.readers.append((slot, version))

    @precondition(lambda self: self.readers)
    @rule(pick=PICK)
    def close_read(self, pick: int) -> None:
        slot, _ = self.readers.pop(pick % len(self.readers))
        self.pool.close_read(slot)
        if slot in self.revoked and not self.readers_on(slot):
            self.revoked.discard(slot)
            assert self.pool.state(slot)[0] is SlotState.FREE, (
                f"slot {slot}: last reader of a revoked slot gone, yet {self.pool.state(slot)}"
            )

    @rule(slot=st.integers(0, 2))
    def a_slot_without_readers_has_none_to_close(self, slot: int) -> None:
        if slot < self.count and not self.readers_on(slot):
            with pytest.raises(ValueError, match="no reader"):
                self.pool.close_read(slot)

    # --- a receiver's model ----------------------------------------------------------

    @rule(slot=st.integers(0, 2))
    def pin(self, slot: int) -> None:
        if slot >= self.count:
            return
        if slot not in self.complete:
            with pytest.raises(ValueError, match="not ready"):
                self.pool.pin(slot)
            return
        self.pool.pin(slot)
        self.pinned = slot

    # --- after every step ------------------------------------------------------------

    @invariant()
    def readers_see_only_checked_bytes_of_their_version(self) -> None:
        for slot, version in self.readers:
            readable = self.pool.readable(slot, version)
            assert readable == self.servable(slot, version), (
                f"reader of {version} on slot {slot}: pool says {readable}, "
                f"model {self.servable(slot, version)}"
            )
            if readable is not None:
                held, written = self.content[slot]
                assert held == version, f"reader of {version} let at bytes of {held}"
                assert readable <= self.verified[slot] <= written

    @invariant()
    def no_slot_offers_bytes_of_a_version_it_does_not_hold(self) -> None:
        # Asked directly too, not only through open reads: a stale (slot, version) pair
        # from a reader that has not yet noticed must get None.
        for slot in range(self.count):
            for version in range(max(0, self.next_version - 3), self.next_version + 1):
                readable = self.pool.readable(slot, version)
                assert readable == self.servable(slot, version), (
                    f"slot {slot} offers {readable} bytes of {version}, "
                    f"model {self.servable(slot, version)}"
                )
                if readable is not None:
                    assert self.content[slot][0] == version

    @invariant()
    def the_pool_agrees_with_the_model(self) -> None:
        for slot in range(self.count):
            state, version, readers, verified, pinned = self.pool.state(slot)
            if slot in self.writing:
                expected = SlotState.WRITING
                assert (version, verified) == (self.writing[slot], self.verified[slot])
            elif slot in self.complete:
                expected = SlotState.READY
                assert (version, verified) == (self.complete[slot], self.verified[slot])
            elif slot in self.revoked:
                expected = SlotState.REVOKED
            else:
                expected = SlotState.FREE
            assert state is expected, f"slot {slot} is {state}, model {expected}"
            assert readers == self.readers_on(slot), f"slot {slot}: {readers} readers"
            assert pinned == (slot == self.pinned), f"slot {slot}: pinned {pinned}"
        assert self.pool.newest() == self.newest()
        assert self.pool.revoked() == sorted(s for s in self.revoked if self.readers_on(s))

    @invariant()
    def a_pinned_slot_stays_ready(self) -> None:
        if self.pinned is not None:
            assert self.pool.state(self.pinned)[0] is SlotState.READY

    @invariant()
    def some_complete_version_stays_readable(self) -> None:
        if self.finished_once:
            newest = self.pool.newest()
            assert newest is not None, "every complete version was given up"
            version = self.pool.state(newest)[1]
            assert version is not None and self.pool.readable(newest, version) is not None


class ThreeSlotMachine(BufferPoolMachine):
    count = 3


# Each step is cheap but checks every slot: half the profile's examples per machine keeps
# both under ten seconds in the ci profile, and the long profile still soaks.
HALF = settings(max_examples=max(1, settings.default.max_examples // 2))
TestTwoSlots = BufferPoolMachine.TestCase
TestTwoSlots.settings = HALF
TestThreeSlots = ThreeSlotMachine.TestCase
TestThreeSlots.settings = HALF


def test_a_pool_needs_two_slots() -> None:
    with pytest.raises(ValueError, match="two"):
        BufferPool(1)


def test_two_slots_alternate_and_keep_the_last_version_readable() -> None:
    pool, served = BufferPool(2), []
    for version in range(6):
        decision = pool.start_write(version)
        assert isinstance(decision, Grant)
        if version:
            # the previous version is still served while this one is written
            assert pool.readable(pool.newest(), version - 1) is not None
        pool.verified(decision.slot, 100)
        pool.finish_write(decision.slot)
        served.append(decision.slot)
    assert served == [0, 1, 0, 1, 0, 1]


def test_a_pinned_newest_and_a_pinned_older_slot_stop_the_writer() -> None:
    pool = BufferPool(2)
    for version in (1, 2):
        slot = pool.start_write(version)
        assert isinstance(slot, Grant)
        pool.finish_write(slot.slot)
    pool.pin(0)  # the model runs on version 1; version 2 is the newest
    assert pool.start_write(3) is None
    pool.pin(1)
    assert pool.start_write(3) == Grant(0)
