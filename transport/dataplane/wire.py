"""The two frames of a payload fetch: their layout, declared once for both ends."""

from __future__ import annotations

import struct
from enum import IntEnum

__all__ = ["REPLY", "REQUEST", "Code"]

REQUEST = struct.Struct("<QQ")  # req_id, key; the store id follows in ascii
REPLY = struct.Struct("<QB")  # req_id, code; the blob follows as its own frame when OK
MAX_STORE_ID = 64  # bytes of a store id a server reads; a longer one is malformed


class Code(IntEnum):
    OK = 0
    UNKNOWN_KEY = 1  # this store never held the key, or freed it
    UNKNOWN_STORE = 2  # the reference names another store: the holder restarted
    MALFORMED = 3
