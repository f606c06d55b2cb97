"""The data plane's messages: payloads as references, what a worker keeps, what it may free."""

from __future__ import annotations

from typing import ClassVar

from msgspec import field

from .base import Kind, Payload, WireStruct

# --- requests ---------------------------------------------------------------------------


class PayloadRef(WireStruct):
    """Where a payload lives on the data plane: the scheduler keeps this, never the bytes.

    ``holder`` is the worker that made it, serving at ``address``; ``store`` names that
    process's store (a restarted holder has a new one); ``checksum`` is the CRC-32C of the
    ``size`` bytes a fetch returns; ``host`` says which host's shared memory holds it, so
    that a reader there knows at once when the holder's store is gone.
    """

    holder: str
    address: str
    store: str
    key: int
    size: int
    checksum: int
    host: str = ""  # the holder's host identity when it keeps the payload in shared memory


class Result(WireStruct):
    """One group's result; admitted work (generate) carries its (min, max) policy versions.

    The payload travels inline in ``data``, or, when ``ref`` is set, stays with the worker
    that made it and ``data`` is empty.
    """

    gid: int
    data: Payload
    behaviour: tuple[int, int] | None = None
    ref: PayloadRef | None = None


class LostPayload(WireStruct):
    """A payload a consumer could not fetch intact: ``role``'s output for group ``gid``."""

    gid: int
    role: str
    reason: str


class Held(WireStruct):
    """The payloads a worker's ``store`` keeps (keys the scheduler acknowledged).

    Answered by Drop: the keys no live group refers to any more, which the store frees.
    """

    KIND: ClassVar[Kind] = Kind.HELD
    worker: str
    store: str
    keys: tuple[int, ...]
    bytes: int = 0  # what the store holds in all, pending keys included (for status)


class Item(WireStruct):
    """A leased group: its key and what earlier stages produced, by role.

    Payloads come inline in ``data`` or as references in ``refs``; a worker fetches the
    referenced ones into ``data`` before its actor sees the item.
    """

    gid: int
    key: str
    data: dict[str, Payload]
    refs: dict[str, PayloadRef] = field(default_factory=dict)


class Drop(WireStruct):
    """Reply to Held: the keys to free."""

    KIND: ClassVar[Kind] = Kind.DROP
    keys: tuple[int, ...]
