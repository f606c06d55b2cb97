"""Pull one version from one source into a slot, range by range, checking every bucket.

Runs on its own thread so that the receiver keeps decoding. Ranges are
``consume_bytes`` long (a receiver short of memory asks for small pieces); a bucket is
checked against the manifest (its CRC-32C, or its MAC where weights cross machines:
..mac) as soon as its last byte is in, and only checked bytes count as received — they
are what a relay passes on, and where a fetch resumes after its source failed. A bucket
that fails its check is fetched once more, then the source is given up. Each request is
sealed with the run's key where there is one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..layout import Manifest
from ..mac import LOCAL_ONLY, BucketCheck, RequestKey
from .node import Request, TransferError, UcxNode, wait
from .store import Store
from .wire import (
    HEADER_BYTES,
    REQUEST_TAG,
    RangeRequest,
    Status,
    TagSource,
    WireError,
    decode_header,
    encode_request,
)

__all__ = ["Declined", "Fetch", "SourceFailed"]


@dataclass(slots=True)
class _Range:
    start: int
    end: int
    header: np.ndarray
    sent: Request
    got_header: Request
    got_data: Request


class SourceFailed(Exception):
    """The source did not deliver: dead, too slow, gone, or its bytes were corrupt."""


class Declined(SourceFailed):
    """The source answered that it does not serve a range (it holds no such version)."""


@dataclass
class Fetch:
    """One attempt to get ``manifest``'s version from ``source`` into ``slot``."""

    manifest: Manifest
    source: str
    source_address: bytes
    slot: int
    node: UcxNode
    store: Store
    consume_bytes: int
    stall_timeout_s: float
    tags: TagSource
    resume_from: int = 0  # checked bytes a previous attempt left in the slot
    window: int = 4  # ranges asked for ahead
    stop: threading.Event = field(default_factory=threading.Event)
    requests: RequestKey | None = None  # seals each request, where the run has a key
    check: BucketCheck | None = None  # of each bucket; None: the manifest's CRC-32C
    verified: int = 0
    retried_buckets: int = 0
    error: str = ""

    def run(self) -> bool:
        """True when the whole version is in the slot and checked."""
        m = self.manifest
        buffer = self.store.buffers[self.slot]
        assert buffer is not None and buffer.size >= m.total
        self.verified = self.resume_from
        retried: set[int] = set()
        # Several ranges are asked for at once so that the source never idles between
        # them; they land in disjoint parts of the buffer, and are taken in order.
        in_flight: deque[_Range] = deque()
        self._asked: list[_Range] = []  # every range asked for, until it has settled
        asked = self.verified
        try:
            while self.verified < m.total:
                if self.stop.is_set():
                    self._drop_all(in_flight)
                    return False
                while len(in_flight) < self.window and asked < m.total:
                    end = min(m.total, asked + self.consume_bytes)
                    in_flight.append(self._ask(buffer, asked, end))
                    asked = end
                self._finish(in_flight.popleft())
                again = self._check(buffer, in_flight[0].start if in_flight else asked, retried)
                if again is not None:  # a corrupt bucket: let the rest land, then ask again
                    for pending in in_flight:
                        self._finish(pending)
                    in_flight.clear()
                    asked = again
        except Declined as error:
            # The source answers every range asked for, on both tags: no receive of ours
            # is left to cancel once those answers are in (the node keeps them till then),
            # and the endpoint, which works, is kept.
            self.error = str(error)
            return False
        except (SourceFailed, TransferError, WireError) as error:
            self._drop_all(in_flight)  # no late bytes land after we move on
            self.error = str(error)
            return False
        except Exception as error:  # UCX refusing the peer outright, e.g. a dead one's address
            self.node.drop(self.source_address)
            self.error = f"{self.source}: {type(error).__name__}: {error}"
            return False
        finally:
            # The node holds every request until it has ended (see UcxNode.settle): a
            # cancelled one within milliseconds, and one whose bytes were under way from
            # a source now dead, which UCX cannot cancel, without holding up this fetch.
            self.node.settle(req for r in self._asked for req in (r.sent, r.got_header, r.got_data))
            self._asked.clear()
        return True

    def _ask(self, buffer: np.ndarray, start: int, end: int) -> _Range:
        tag = self.tags.take()
        header = np.zeros(HEADER_BYTES, np.uint8)
        address = self.source_address
        got_header = self.node.recv(address, header, tag)
        got_data = self.node.recv(address, buffer[start:end], tag + 1)
        request = RangeRequest(
            self.manifest.version,
            start,
            end,
            tag,
            self.node.address,
            self.node.generation(address),
            self.tags.sequence(),
        )
        seal = None if self.requests is None else self.requests.seal(address)
        sent = self.node.send(address, encode_request(request, seal), REQUEST_TAG)
        r = _Range(start, end, header, sent, got_header, got_data)
        self._asked.append(r)
        return r

    def _finish(self, r: _Range) -> None:
        # The deadline is per range: a slow but moving source is not a dead one.
        deadline = time.monotonic() + self.stall_timeout_s
        for what, request in (("request", r.sent), ("header", r.got_header)):
            if not wait(request, deadline, self.source, what):
                self._give_up(f"no {what} in {self.stall_timeout_s:g} s")
        status, detail = decode_header(r.header)
        if status is not Status.OK:
            raise Declined(f"{self.source}: {status.name.lower()}: {detail}")
        if not wait(r.got_data, time.monotonic() + self.stall_timeout_s, self.source, "range"):
            self._give_up(f"range [{r.start}, {r.end}) not in after {self.stall_timeout_s:g} s")

    def _drop_all(self, in_flight: deque[_Range]) -> None:
        if in_flight:
            self.node.drop(self.source_address)  # cancels the receives still posted

    def _check(self, buffer: np.ndarray, position: int, retried: set[int]) -> int | None:
        """Check every bucket now complete; where to ask again if one was corrupt."""
        m = self.manifest
        check = self.check or BucketCheck(m, LOCAL_ONLY)
        while self.verified < m.total:
            index = self.verified // m.bucket_bytes
            start, end = m.bucket_range(index)
            if position < end:
                return None
            if not check(index, memoryview(buffer)[start:end]):
                if index in retried:
                    raise SourceFailed(f"bucket {index} of version {m.version} corrupt twice")
                retried.add(index)
                self.retried_buckets += 1
                return start
            self.verified = end
            with self.store.changed:
                self.store.pool.verified(self.slot, end)
                self.store.changed.notify_all()
        return None

    def _give_up(self, reason: str) -> None:
        # Our receives may still be posted: closing the endpoint cancels them, so no late
        # bytes land in the buffer after we move on.
        self.node.drop(self.source_address)
        raise SourceFailed(f"{self.source}: {reason}")
