"""A worker's payloads, kept until the scheduler no longer refers to them.

A payload enters with :meth:`PayloadStore.put` (packed once, checksummed) and is
*pending* until the scheduler acknowledges the completion that refers to it: only
acknowledged keys are reported in Held, so the scheduler never frees a key it has not yet
journaled a reference to. A completion the scheduler refused frees its keys at once.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import crc32c

from .. import protocol as p

__all__ = ["PayloadStore", "StoreStats"]


@dataclass(frozen=True, slots=True)
class StoreStats:
    payloads: int
    bytes: int
    peak_bytes: int
    served: int  # fetches answered with bytes


class PayloadStore:
    """Payloads by key, shared by the worker's main thread and its server's thread."""

    def __init__(self, holder: str, address: str = "") -> None:
        self.holder = holder
        self.address = address  # where the server answers; set once it is bound
        self.store_id = secrets.token_hex(8)  # a restarted process never reuses it
        self._lock = threading.Lock()
        self._blobs: dict[int, bytes] = {}
        self._acknowledged: set[int] = set()
        self._next_key = 1
        self._bytes = 0
        self._peak = 0
        self._served = 0

    def put(self, payload: p.Payload) -> p.PayloadRef:
        """Keep ``payload``; the reference a consumer fetches it by."""
        return self.put_blob(p.pack_payload(payload))

    def put_blob(self, blob: bytes) -> p.PayloadRef:
        checksum = crc32c.crc32c(blob)
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._blobs[key] = blob
            self._bytes += len(blob)
            self._peak = max(self._peak, self._bytes)
        return p.PayloadRef(self.holder, self.address, self.store_id, key, len(blob), checksum)

    def get(self, key: int) -> bytes | None:
        with self._lock:
            blob = self._blobs.get(key)
            if blob is not None:
                self._served += 1
            return blob

    def acknowledge(self, keys: Iterable[int]) -> None:
        """The scheduler journaled references to ``keys``: they may be reported as held."""
        with self._lock:
            self._acknowledged.update(k for k in keys if k in self._blobs)

    def acknowledged(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._acknowledged))

    def keys(self) -> set[int]:
        with self._lock:
            return set(self._blobs)

    def discard(self, keys: Iterable[int]) -> int:
        """Free ``keys`` (unknown ones are ignored). Returns how many bytes were freed."""
        freed = 0
        with self._lock:
            for key in keys:
                blob = self._blobs.pop(key, None)
                self._acknowledged.discard(key)
                if blob is not None:
                    freed += len(blob)
            self._bytes -= freed
        return freed

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(len(self._blobs), self._bytes, self._peak, self._served)
