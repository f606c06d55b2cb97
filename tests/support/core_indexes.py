"""Each index the scheduler core keeps (runtime/scheduler/core/indexes.py, liveness.py), against a
plain scan of the state it is derived from: what the property machine and the unit tests
check after every operation."""

from __future__ import annotations

import copy
from collections import Counter

from asyncrl.runtime.scheduler.core import SchedulerCore

__all__ = ["index_mismatches"]


def index_mismatches(core: SchedulerCore, now: float) -> list[str]:
    """What differs between each index and its scan; empty when they agree."""
    state, indexes = core.state, core.state.indexes
    found = []
    by_worker: dict[str, list[int]] = {}
    for lease in state.leases.values():
        by_worker.setdefault(lease.worker, []).append(lease.lid)
    indexed = {w: list(held) for w, held in indexes.by_worker.items()}
    if indexed != by_worker:
        found.append(f"leases by worker {indexed} != scan {by_worker}")
    for worker, lids in by_worker.items():
        if [lease.lid for lease in state.leases_of(worker)] != lids:
            found.append(f"leases_of({worker!r}) out of order")
    by_role = Counter(lease.role for lease in state.leases.values())
    if indexes.by_role != by_role:
        found.append(f"leases by role {dict(indexes.by_role)} != scan {dict(by_role)}")
    suspected = Counter(g.state for g in state.groups.values() if g.suspects)
    if indexes.suspected != suspected:
        found.append(f"suspected {dict(indexes.suspected)} != scan {dict(suspected)}")
    loaded: dict[str, Counter[int | None]] = {}
    for worker in state.workers.values():
        loaded.setdefault(worker.role, Counter())[worker.loaded] += 1
    if {r: c for r, c in indexes.versions.items() if c} != loaded:
        found.append(f"versions loaded {indexes.versions} != scan {loaded}")
    expiring = set(indexes.expiry)
    for lease in state.leases.values():
        if (lease.expires_at, lease.lid) not in expiring:
            found.append(f"lease {lease.lid} missing from the expiry heap")
    for stage, heap in indexes.available.items():
        offered = {entry[1] for entry in heap}
        for gid, group in state.groups.items():
            busy = stage.role in group.done or stage.role in group.leases
            if group.state == stage.source and not busy and gid not in offered:
                found.append(f"group {gid} takeable by {stage.role} but not offered")
    timeout = core.settings.worker_timeout
    for when in (now, now + timeout / 2, now + timeout, now + 2 * timeout):
        scan = [w for w, seen in core.last_seen.items() if seen + timeout <= when]
        silent = copy.deepcopy(core.last_seen).silent(when)
        if silent != scan:
            found.append(f"silent at {when}: {silent} != scan {scan}")
    return found
