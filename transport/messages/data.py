"""The data plane's messages: payloads as references, what a worker keeps, what it may free."""

from __future__ import annotations

import re
from typing import ClassVar

from msgspec import field

from .base import Kind, Payload, WireStruct

# A store's name becomes part of a path in shared memory (``asyncrl-payloads-<store>``),
# so nothing else than this is taken: no separator, no "..", bounded.
STORE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_store_name(name: str) -> None:
    """ValueError unless ``name`` is a store's name (:data:`STORE_NAME`)."""
    if not STORE_NAME.fullmatch(name):
        raise ValueError(f"store {name[:80]!r} is not a store name (1 to 64 of A-Z a-z 0-9 _ -)")


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

    def __post_init__(self) -> None:
        check_store_name(self.store)


class Result(WireStruct):
    """One group's result; admitted work (generate) carries its (min, max) policy versions.

    The payload travels inline in ``data``, or, when ``ref`` is set, stays with the worker
    that made it and ``data`` is empty. ``filtered``, from a stage that filters (the
    reward): why the group carries no learning signal, in one line; it is then never
    trained (dynamic sampling, ``algorithm.filter_groups``).
    """

    gid: int
    data: Payload
    behaviour: tuple[int, int] | None = None
    ref: PayloadRef | None = None
    filtered: str | None = None


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

    def __post_init__(self) -> None:
        check_store_name(self.store)


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
