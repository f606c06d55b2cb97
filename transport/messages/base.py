"""What every message of the bus shares: the protocol version, the kinds, the struct base."""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any

from msgspec import Struct

__all__ = ["PROTOCOL_VERSION", "Kind", "Payload", "WireStruct", "check_finite"]

PROTOCOL_VERSION = 2  # 2: payloads may travel as references (the data plane)

Payload = dict[str, Any]
"""A role's result for one group: str keys; values are MessagePack types or numpy arrays."""


class Kind(IntEnum):
    # worker -> scheduler (requests)
    HELLO = 1
    HEARTBEAT = 2
    CLAIM = 3
    COMPLETE = 4
    FAIL = 5
    LOCK = 6
    UNLOCK = 7
    PUBLISH_VERSION = 8
    LOADED_VERSION = 9
    ADD_GROUPS = 10
    BYE = 11
    REPORT = 12
    WANT_WEIGHTS = 13
    HELD = 14
    REWIND = 15
    # observers -> scheduler
    STATUS = 20
    STOP = 21
    # scheduler -> worker (replies)
    READY = 40
    ACK = 41
    ERROR = 42
    LEASE = 43
    NO_WORK = 44
    WANT = 45
    ADDED = 46
    LOCK_GRANTED = 47
    LOCK_QUEUED = 48
    STATUS_REPLY = 49
    SHUTDOWN = 50
    WEIGHTS_PLAN = 51
    DROP = 52
    STEP_DONE = 53
    # scheduler -> everyone (PUB)
    EVENT = 60


class WireStruct(Struct, frozen=True, array_like=True, forbid_unknown_fields=True, gc=False):
    """Fields as a list (a longer list than declared is refused), immutable, and outside
    the cycle collector (messages hold no cycles; tracking thousands of small ones a second
    would cost collections). A new field goes last, with a default, so that an older
    sender's messages still decode."""


def check_finite(owner: str, name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name}: {value!r} is not a finite number")
