"""Snapshots: the core's durable state as plain MessagePack-able data, and back.

A snapshot bounds replay time: restore loads it and applies only the records after it.
Derived indexes are not stored; ``load_state`` rebuilds them from the groups.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from asyncrl.runtime.contract.stages import GroupState, Pipeline

from .entities import NONE, Group, Lease, Resource, Worker
from .fences import FenceCipher
from .transitions import CoreState

__all__ = ["dump_state", "load_state"]

FORMAT = 3


def dump_state(state: CoreState) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "counters": [
            state.next_gid,
            state.next_lid,
            state.fence,
            state.steps_done,
            state.policy_version,
            state.counts[GroupState.TRAINED],
            state.worst_staleness,
            state.epoch,
        ],
        "keys": list(state.keys),  # in the order added: the same live and replayed
        "regenerated": dict(state.regenerated),
        "training": [
            state.durable_step,
            state.rollbacks,
            sorted(state.retained.items()),
            state.counts[GroupState.SUPERSEDED],
        ],
        "critic": [state.critic_steps_done, state.critic_version, state.worst_critic_staleness],
        "filtered": [state.counts[GroupState.FILTERED], state.filtered_in_a_row],
        "groups": [_dump_group(g) for g in state.groups.values()],
        "leases": [_dump_lease(lease) for lease in state.leases.values()],
        "workers": {name: [w.role, w.loaded] for name, w in sorted(state.workers.items())},
        "resources": {
            name: [r.capacity, sorted(r.holders.items()), list(r.waiting)]
            for name, r in state.resources.items()
        },
    }


def _dump_group(g: Group) -> list[Any]:
    return [
        g.gid,
        g.key,
        g.state.value,
        sorted(g.done),
        sorted(g.leases.items()),
        sorted(g.attempts.items()),
        g.train_by,
        None if g.behaviour is None else list(g.behaviour),
        g.reason,
        g.data,
        sorted(g.suspects),
        g.critic_version,
    ]


def _dump_lease(lease: Lease) -> list[Any]:
    return [
        lease.lid,
        lease.fence,
        lease.role,
        lease.source.value,
        lease.worker,
        lease.expires_at,
        sorted(lease.gids),
        lease.version,
        sorted(lease.locks.items()),
        sorted(lease.dropped),
    ]


def load_state(
    pipeline: Pipeline,
    resources: dict[str, int],
    snap: dict[str, Any],
    fences: FenceCipher | None = None,
) -> CoreState:
    if snap.get("format") != FORMAT:
        raise ValueError(f"snapshot format {snap.get('format')!r}; this build reads {FORMAT}")
    state = CoreState(pipeline, resources, fences)
    (state.next_gid, state.next_lid, state.fence, state.steps_done, state.policy_version,
     trained, state.worst_staleness, state.epoch) = snap["counters"]  # fmt: skip
    state.counts[GroupState.TRAINED] = trained
    state.keys = dict.fromkeys(snap["keys"])
    state.regenerated.update(snap.get("regenerated", {}))  # absent before the data plane
    # absent before training could roll back
    training = snap.get("training", [0, 0, []])
    state.durable_step, state.rollbacks, retained = training[:3]
    state.retained = {step: kept for step, kept in retained}
    # absent before a critic could be trained
    (state.critic_steps_done, state.critic_version, state.worst_critic_staleness) = snap.get(
        "critic", [0, 0, -1]
    )
    # absent before groups could be filtered
    filtered, state.filtered_in_a_row = snap.get("filtered", [0, 0])
    state.counts[GroupState.FILTERED] = filtered
    for row in snap["groups"]:
        _load_group(state, row)
    # Absent before superseded groups were counted: every group made that is neither in
    # the table nor trained is one a rollback superseded.
    superseded = (
        training[3]
        if len(training) > 3
        else state.next_gid - trained - filtered - len(state.groups)
    )
    state.counts[GroupState.SUPERSEDED] = superseded
    for row in snap["leases"]:
        _load_lease(state, row)
    state.workers = {name: Worker(role, loaded) for name, (role, loaded) in snap["workers"].items()}
    for worker in state.workers.values():
        state.indexes.joined(worker)
    for name, (capacity, holders, waiting) in snap["resources"].items():
        state.resources[name] = Resource(capacity, dict(map(tuple, holders)), deque(waiting))
    return state


def _load_group(state: CoreState, row: list[Any]) -> None:
    gid, key, st, done, leases, attempts, train_by, behaviour, reason, data = row[:10]
    suspects = row[10] if len(row) > 10 else []  # absent before deaths were attributed
    critic_version = row[11] if len(row) > 11 else None  # absent before the critic
    group = Group(
        gid,
        key,
        GroupState(st),
        frozenset(done) or NONE,
        dict(map(tuple, leases)),
        dict(map(tuple, attempts)),
        train_by,
        None if behaviour is None else tuple(behaviour),
        critic_version,
        reason,
        data,
        frozenset(suspects) or NONE,
    )
    state.groups[gid] = group
    state.counts[group.state] += 1
    if train_by is not None:
        state.due[train_by] += 1
        if group.state == state.step_source:
            state.due_ready[train_by] += 1
    state.indexes.loaded(group)


def _load_lease(state: CoreState, row: list[Any]) -> None:
    lid, fence, role, source, worker, expires_at, gids, version, locks = row[:9]
    dropped = row[9] if len(row) > 9 else []  # absent before groups could be filtered
    lease = state.leases[lid] = Lease(
        lid,
        fence,
        role,
        GroupState(source),
        worker,
        expires_at,
        set(gids),
        version,
        dict(map(tuple, locks)),
        set(dropped),
    )
    state.indexes.leased(lease)
