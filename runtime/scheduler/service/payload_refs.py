"""What the scheduler keeps of a payload, and what it hands out with a lease.

The core keeps, per group and role, either a small payload's packed bytes (inline: a
reference would cost more than the bytes) or a reference to where a worker keeps it,
as a plain list ``[holder, address, store, key, size, checksum, host]`` so that it
journals as it is. The scheduler never unpacks, copies or journals a referenced payload's bytes:
its cost per group is the same for 1 KiB and 100 MiB.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from asyncrl.transport import protocol as p

__all__ = [
    "PayloadStores",
    "RefIndex",
    "holder_of",
    "is_ref",
    "lease_item",
    "store_of",
    "stored",
]

_HOLDER, _STORE, _KEY = 0, 2, 3  # positions in a kept reference


def stored(result: p.Result) -> bytes | list[Any]:
    """What the core keeps of ``result``'s payload."""
    ref = result.ref
    if ref is None:
        return p.pack_payload(result.data)
    return [ref.holder, ref.address, ref.store, ref.key, ref.size, ref.checksum, ref.host]


def is_ref(kept: Any) -> bool:
    return isinstance(kept, list | tuple)


def holder_of(kept: Any) -> str | None:
    """The worker keeping a referenced payload; None for an inline one, or none at all."""
    return kept[_HOLDER] if is_ref(kept) else None


def store_of(kept: Any) -> str | None:
    """The store keeping a referenced payload; None for an inline one, or none at all."""
    return kept[_STORE] if is_ref(kept) else None


def lease_item(gid: int, key: str, data: dict[str, Any], reads: Collection[str]) -> p.Item:
    """The leased form of a group, the payloads of the roles in ``reads`` only: inline
    payloads unpacked, references passed on."""
    inline, refs = {}, {}
    for role, kept in data.items():
        if role not in reads:
            continue
        if is_ref(kept):
            refs[role] = p.PayloadRef(*kept)
        else:
            inline[role] = p.unpack_payload(kept)
    return p.Item(gid, key, inline, refs)


class _WithData(Protocol):
    data: dict[str, Any]


class RefIndex:
    """Which group and role each referenced payload belongs to, by (store, key), so that a
    holder's Held costs the keys it asks about, not a scan of every live group.

    Built by one scan on first use (after a start or a restart, or after ``forget``),
    then told of each reference the core keeps (``noted``). An entry is checked against
    its group when asked about, so one gone stale (the group trained, died, or had the
    payload made again) answers "not live" and leaves; entries nobody asks about again
    (a dead holder's) are dropped by a fresh scan once they outnumber the live ones.
    """

    def __init__(self) -> None:
        self._where: dict[tuple[str, int], tuple[int, str]] | None = None
        self._built_with = 0  # entries at the last scan

    def noted(self, store: str, key: int, gid: int, role: str) -> None:
        if self._where is not None:
            self._where[(store, key)] = (gid, role)

    def forget(self) -> None:
        self._where = None

    def live(self, groups: Mapping[int, _WithData], store: str, keys: Sequence[int]) -> set[int]:
        """The ``keys`` of ``store`` that some live group still refers to."""
        where = self._where
        if where is None or len(where) > 4 * self._built_with + 4096:
            where = self._where = _scan(groups)
            self._built_with = len(where)
        found = set()
        for key in keys:
            at = where.get((store, key))
            if at is None:
                continue
            group = groups.get(at[0])
            kept = group.data.get(at[1]) if group is not None else None
            if is_ref(kept) and kept[_STORE] == store and kept[_KEY] == key:
                found.add(key)
            else:
                del where[(store, key)]
        return found


def _scan(groups: Mapping[int, _WithData]) -> dict[tuple[str, int], tuple[int, str]]:
    return {
        (kept[_STORE], kept[_KEY]): (gid, role)
        for gid, group in groups.items()
        for role, kept in group.data.items()
        if is_ref(kept)
    }


class PayloadStores:
    """The workers' payload stores as the scheduler knows them: what each last reported
    holding, the store of each worker's live process (a payload kept in any other store
    was kept by a process that is gone), and which group refers to each kept payload."""

    def __init__(self) -> None:
        self.reported: dict[str, dict[str, int]] = {}  # worker -> what its store holds
        self.live: dict[str, str] = {}  # worker -> the store of its live process
        self.refs = RefIndex()  # which group refers to each kept payload, for Held

    def forget(self, worker: str) -> None:
        """``worker`` is gone: its store with it."""
        self.reported.pop(worker, None)
        self.live.pop(worker, None)
