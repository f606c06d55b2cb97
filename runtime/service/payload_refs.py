"""What the scheduler keeps of a payload, and what it hands out with a lease.

The core keeps, per group and role, either a small payload's packed bytes (inline: a
reference would cost more than the bytes) or a reference to where a worker keeps it,
as a plain list ``[holder, address, store, key, size, checksum, host]`` so that it
journals as it is. The scheduler never unpacks, copies or journals a referenced payload's bytes:
its cost per group is the same for 1 KiB and 100 MiB.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from asyncrl.transport import protocol as p

__all__ = ["holder_of", "is_ref", "lease_item", "live_keys", "store_of", "stored"]

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


def live_keys(datas: Iterable[dict[str, Any]], store: str) -> set[int]:
    """The keys of ``store`` that some live group still refers to."""
    return {
        kept[_KEY]
        for data in datas
        for kept in data.values()
        if is_ref(kept) and kept[_STORE] == store
    }
