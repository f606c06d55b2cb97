"""What the core looks up on every claim, heartbeat and tick, kept so that no lookup scans
every group, lease or worker.

Derived state, never journaled: ``CoreState``'s handlers keep it up to date as they apply
records, so a replay rebuilds it, and codec.py rebuilds it when a snapshot is loaded. A
test compares each index with a plain scan of the state after random operations
(tests/unit/runtime/scheduler/test_core_indexes.py).
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Any

from asyncrl.runtime.contract.stages import GroupState, Pipeline, Stage

from .entities import NONE, Group, Lease, Worker

__all__ = ["Indexes"]


class Indexes:
    """- ``available``: per stage, a heap of (order key, gid) that *may* be takeable
      (stale entries are skipped by whoever pops them);
    - ``expiry``: a heap of (expires_at, lid); stale once a lease ended or was renewed;
    - ``by_worker``: each worker's live leases, in the order they were granted;
    - ``by_role``: how many live leases each role holds;
    - ``suspected``: per state, how many groups are suspected by some role (blame.py);
    - ``versions``: per role, how many workers run each policy version (None: none yet).
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.available: dict[Stage, list[tuple[Any, int]]] = {s: [] for s in pipeline.stages}
        # per state: the heaps a group entering it joins, and whether they order by train_by
        self._fanout = {
            state: [(self.available[s], s.gate.batched) for s in pipeline.consumers(state)]
            for state in GroupState
        }
        self.expiry: list[tuple[float, int]] = []
        self.by_worker: dict[str, dict[int, Lease]] = {}
        self.by_role: Counter[str] = Counter()
        self.suspected: Counter[GroupState] = Counter()
        self.versions: dict[str, Counter[int | None]] = {}

    def offer(self, group: Group) -> None:
        gid = group.gid
        for heap, by_train_by in self._fanout[group.state]:
            heapq.heappush(heap, ((group.train_by, gid) if by_train_by else gid, gid))

    # --- leases ------------------------------------------------------------------------

    def leased(self, lease: Lease) -> None:
        self.by_worker.setdefault(lease.worker, {})[lease.lid] = lease
        self.by_role[lease.role] += 1
        self.renewed(lease)

    def renewed(self, lease: Lease) -> None:
        heapq.heappush(self.expiry, (lease.expires_at, lease.lid))

    def ended(self, lease: Lease) -> None:
        held = self.by_worker[lease.worker]
        del held[lease.lid]
        if not held:
            del self.by_worker[lease.worker]
        _less(self.by_role, lease.role)

    def leases_of(self, worker: str) -> list[Lease]:
        return list(self.by_worker.get(worker, {}).values())

    # --- workers -----------------------------------------------------------------------

    def joined(self, worker: Worker) -> None:
        self.versions.setdefault(worker.role, Counter())[worker.loaded] += 1

    def left(self, worker: Worker) -> None:
        _less(self.versions[worker.role], worker.loaded)

    # --- suspects ----------------------------------------------------------------------

    def suspect_added(self, group: Group, role: str) -> None:
        """Before ``role`` joins ``group.suspects``."""
        if not group.suspects:
            self.suspected[group.state] += 1
        group.suspects |= {role}

    def suspect_cleared(self, group: Group, role: str) -> None:
        if role in group.suspects:
            group.suspects = group.suspects - {role} or NONE
            if not group.suspects:
                _less(self.suspected, group.state)

    def moved(self, group: Group, source: GroupState) -> None:
        """``group`` went from ``source`` to its state."""
        if group.suspects:
            _less(self.suspected, source)
            self.suspected[group.state] += 1

    def loaded(self, group: Group) -> None:
        """A group read from a snapshot."""
        if group.suspects:
            self.suspected[group.state] += 1
        self.offer(group)

    def forgotten(self, group: Group) -> None:
        """A group left the table (trained)."""
        if group.suspects:
            _less(self.suspected, group.state)


def _less(counter: Counter[Any], key: Any) -> None:
    """One fewer of ``key``, without keeping zeros."""
    value = counter[key] - 1
    if value:
        counter[key] = value
    else:
        del counter[key]
