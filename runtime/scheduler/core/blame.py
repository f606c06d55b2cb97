"""Who is blamed when work ends badly, for the scheduler core (DESIGN: a group dies only
when it is the likely cause). A group goes to ``dead`` after ``max_attempts`` tries of one
role counted against it, and a try counts only when the group is the likely cause:

- a worker *fails* groups (its actor raised on them): each named group is blamed;
- a worker *dies* holding groups (it registered again as a new process, fell silent, or
  let its leases run out while silent): if it held one group, that group is blamed; if it
  held several, those already *suspected* by an earlier death are blamed and the others
  become suspects, unblamed. A worker is leased at most one suspect at a time (the train
  step excepted, whose batch is what it is), so a group that kills every worker taking
  it is soon the one suspect of the deaths it causes, while a random kill costs the
  groups it hit no try. A suspect that completes the role is cleared;
- nobody is blamed when a worker leaves on purpose (Bye), when a lease runs out that
  its live worker never named as held (the grant was lost on its way), when a payload's
  holder dies (the payload is made again), or when the scheduler restarts (its leases
  are renewed).

``SchedulerCore`` holds one :class:`Blame`, given the state it reads and the core's commit:
sans-IO like the rest of the core, it decides and commits records, never changing the
state itself.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.runtime.contract.stages import Stage

from . import journal_records as r
from .entities import Lease
from .settings import CoreSettings
from .transitions import CoreState

__all__ = ["Blame"]


class Blame:
    """Whose fault a lost try is: the groups a dead worker held, a failed group, a lost
    payload; each blamed try goes against the group's attempts, and the last one kills it.
    And what a worker may take: at most one suspect at a time."""

    def __init__(
        self, state: CoreState, settings: CoreSettings, commit: Callable[[r.Record], None]
    ) -> None:
        self.state = state
        self.max_attempts = settings.max_attempts
        self._commit = commit

    def revoke(self, worker: str, reason: str, died: bool) -> None:
        leases = self.state.leases_of(worker)
        if not died:
            for lease in leases:
                self._commit(r.Failed(lease.lid, sorted(lease.gids), reason, counted=False))
            return
        held = [(lease, gid) for lease in leases for gid in sorted(lease.gids)]
        groups = self.state.groups
        blamed = {gid for lease, gid in held if lease.role in groups[gid].suspects}
        if not blamed and len(held) == 1:
            blamed = {held[0][1]}
        for lease in leases:
            why, gids = f"{lease.role}: {reason}", sorted(lease.gids)
            spared = [g for g in gids if g not in blamed]
            if spared:
                self._commit(r.Failed(lease.lid, spared, why, counted=False, suspect=True))
            self.fail_groups(lease, [g for g in gids if g in blamed], why, True)

    def _holds_suspect(self, worker: str, role: str) -> bool:
        groups = self.state.groups
        return any(
            role in groups[gid].suspects
            for lease in self.state.leases_of(worker)
            for gid in lease.gids
            if lease.role == role
        )

    def lose(self, lease: Lease, gid: int, role: str, reason: str, counted: bool) -> None:
        """``role``'s payload of ``gid`` is gone: made again, or the group dies trying."""
        tries = self.state.groups[gid].attempts.get(role, 0) + 1
        if counted and tries >= self.max_attempts:
            self._commit(r.Killed([gid], f"{reason} (attempt {self.max_attempts})"))
        else:
            self._commit(r.Lost(lease.lid, gid, role, reason, counted))

    def fail_groups(
        self, lease: Lease, gids: Sequence[int], reason: str, suspect: bool = False
    ) -> None:
        """Blame ``gids`` for a try of the lease's role: back to be tried again, or dead."""
        limit, role = self.max_attempts, lease.role
        groups = self.state.groups
        last = [g for g in gids if groups[g].attempts.get(role, 0) + 1 >= limit]
        retry = [g for g in gids if g not in set(last)]
        if retry:
            self._commit(r.Failed(lease.lid, retry, reason, suspect=suspect))
        if last:
            self._commit(r.Killed(last, f"{reason} (attempt {limit} of {limit})"))

    def take(self, stage: Stage, worker: str, n: int) -> list[int]:
        """Pop up to ``n`` takeable groups; entries that went stale are dropped lazily.

        At most one suspect (see above) per worker, so that its next death names it;
        suspects passed over stay in the heap for another worker or a later claim."""
        heap, groups, taken = self.state.available(stage), self.state.groups, []
        source, role = stage.source, stage.role
        isolate = not stage.gate.batched
        suspect_held = isolate and self._holds_suspect(worker, role)
        passed: list[tuple[Any, int]] = []
        while heap and len(taken) < n:
            entry = heapq.heappop(heap)
            gid = entry[1]
            group = groups.get(gid)  # None once trained
            if (
                group is None
                or group.state != source
                or role in group.done
                or role in group.leases
                or gid in taken
            ):
                continue
            if isolate and role in group.suspects:
                if suspect_held:
                    passed.append(entry)
                    continue
                suspect_held = True
            taken.append(gid)
        for entry in passed:
            heapq.heappush(heap, entry)
        return taken
