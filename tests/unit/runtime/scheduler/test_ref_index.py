"""A holder's Held is answered from an index of kept references (service/payload_refs.py
``RefIndex``), not a scan of every live group: after random operations it answers as
the scan does, built afresh or kept up to date, and it does not grow without bound."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from asyncrl.runtime.scheduler.service.payload_refs import RefIndex

ROLES = ("generate", "logp", "reward")
STORES = ("s0", "s1", "s2")


@dataclass
class G:
    data: dict[str, Any] = field(default_factory=dict)


def ref(store: str, key: int) -> list[Any]:
    return ["holder", "tcp://h:1", store, key, 10, 0, "host"]


def scan(groups: dict[int, G], store: str, keys: list[int]) -> set[int]:
    live = {
        kept[3]
        for g in groups.values()
        for kept in g.data.values()
        if isinstance(kept, list) and kept[2] == store
    }
    return live & set(keys)


@pytest.mark.parametrize("seed", range(5))
def test_held_is_answered_as_a_scan_would(seed: int) -> None:
    rng = random.Random(seed)
    groups: dict[int, G] = {}
    index, next_key, next_gid = RefIndex(), 0, 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.3:
            groups[next_gid] = G({"dataloader": b"prompt"})
            next_gid += 1
        elif op < 0.6 and groups:  # a stage completes (again, once a payload was lost)
            gid, role, store = rng.choice(list(groups)), rng.choice(ROLES), rng.choice(STORES)
            groups[gid].data[role] = ref(store, next_key)
            index.noted(store, next_key, gid, role)
            next_key += 1
        elif op < 0.7 and groups:  # trained or redone: the group or a payload goes
            gid = rng.choice(list(groups))
            if rng.random() < 0.5:
                del groups[gid]
            else:
                groups[gid].data.pop(rng.choice(ROLES), None)
        else:
            store = rng.choice(STORES)
            keys = rng.sample(range(next_key + 1), min(next_key + 1, 20))
            assert index.live(groups, store, keys) == scan(groups, store, keys)
            assert RefIndex().live(groups, store, keys) == scan(groups, store, keys)


def test_entries_nobody_asks_about_are_dropped_by_a_fresh_scan() -> None:
    groups: dict[int, G] = {0: G()}
    index = RefIndex()
    index.live(groups, "s0", [])  # built: empty
    for key in range(20_000):  # a holder that died before asking about any of these
        index.noted("dead", key, 0, "generate")
    index.live(groups, "s0", [1])
    assert index._where is not None and len(index._where) == 0
