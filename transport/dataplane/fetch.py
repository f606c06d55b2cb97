"""Fetching payloads from their holders, checked against their references.

A payload whose holder keeps it in shared memory on this host is mapped (copy-on-write:
its arrays are writable views, and nothing is copied until a page is written). The rest
are asked for all at once (one request each, over one DEALER per holder), so a lease's
fetch takes about as long as its slowest holder, not the sum. Bytes whose size or CRC-32C
do not match the reference are asked for once more (a flipped bit in flight); if they are
wrong again, or the holder no longer has them, or does not answer in time, that payload is
reported as a :class:`FetchFailure`, and the caller tells the scheduler, which has the
stage that made it run again.
"""

from __future__ import annotations

import itertools
import mmap
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import crc32c
import zmq

from .. import protocol as p
from ..host import host_identity
from ..security import ClientKeys
from . import image
from .store import shared_path
from .wire import REPLY, REQUEST, Code

__all__ = ["FetchFailure", "PayloadFetcher", "PayloadsUnavailable"]

_TRIES_WHEN_CORRUPT = 2
_CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class FetchFailure:
    index: int  # position in the fetched sequence
    ref: p.PayloadRef
    reason: str


class PayloadsUnavailable(Exception):
    """Some payloads could not be fetched intact; ``failures`` names each."""

    def __init__(self, failures: Sequence[FetchFailure]) -> None:
        self.failures = tuple(failures)
        first = self.failures[0]
        more = f" (and {len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
        super().__init__(f"payload {first.ref.key} of {first.ref.holder}: {first.reason}{more}")


@dataclass(slots=True)
class _Pending:
    index: int
    ref: p.PayloadRef
    tries: int = 1


class PayloadFetcher:
    """A consumer's side of the data plane; used from one thread."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_message_bytes: int,
        keys: ClientKeys,
        shared_dir: Path | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        # A live holder accepts a connection in milliseconds, also across hosts.
        self.connect_timeout_s = min(timeout_s, _CONNECT_TIMEOUT_S)
        self.shared_dir = shared_dir  # where holders on this host keep their payloads
        self._max_message_bytes = max_message_bytes
        self._keys = keys
        self._ctx = zmq.Context()
        self._sockets: dict[str, zmq.Socket] = {}
        self._req_ids = itertools.count(1)
        self.fetched_bytes = 0  # over ZeroMQ
        self.mapped_bytes = 0  # from shared memory
        self.refetched = 0  # payloads asked for again after a bad checksum

    def fetch(self, refs: Sequence[p.PayloadRef]) -> list[p.Payload]:
        """The payloads behind ``refs``, in order; PayloadsUnavailable names what failed."""
        blobs: list[memoryview | None] = [None] * len(refs)
        failures: list[FetchFailure] = []
        pending: dict[int, _Pending] = {}
        unreachable: set[str] = set()  # each waited for once, not once per payload it held
        for index, ref in enumerate(refs):
            local = self._mapped(ref)
            if isinstance(local, memoryview):
                blobs[index] = local
            elif local is not None:  # on this host, and gone: no need to ask anyone
                failures.append(FetchFailure(index, ref, local))
            elif ref.address in unreachable:
                failures.append(FetchFailure(index, ref, self._unreachable(ref.address)))
            elif lost := self._ask(pending, _Pending(index, ref)):
                failures.extend(lost)
                unreachable.add(ref.address)
        deadline = time.monotonic() + self.timeout_s
        while pending:
            left_ms = int((deadline - time.monotonic()) * 1000)
            ready = self._poll(pending, left_ms) if left_ms > 0 else []
            if not ready:
                failures.extend(self._time_out(pending))
                break
            for socket in ready:
                self._take_replies(socket, pending, blobs, failures)
        payloads = []
        for index, blob in enumerate(blobs):
            try:
                payloads.append(image.read(blob) if blob is not None else None)
            except image.ImageError as error:  # checksummed, yet not an image: a bug
                failures.append(FetchFailure(index, refs[index], str(error)))
        if failures:
            raise PayloadsUnavailable(sorted(failures, key=lambda f: f.index))
        return payloads  # type: ignore[return-value]

    def _mapped(self, ref: p.PayloadRef) -> memoryview | str | None:
        """``ref``'s image mapped from shared memory, if its holder keeps it on this host
        and the bytes check out; why it cannot be had, if its holder kept it on this host
        and it is gone; else None (it is then fetched over ZeroMQ)."""
        if self.shared_dir is None:
            return None
        path = shared_path(self.shared_dir, ref.store, ref.key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            if ref.host != host_identity():
                return None  # kept elsewhere: ask its holder
            if not path.parent.exists():  # a store's directory lives as long as its process
                return "the holder's store is gone (its process ended)"
            return "the holder no longer has it"
        try:
            if os.fstat(fd).st_size != ref.size or ref.size == 0:
                return None
            view = memoryview(mmap.mmap(fd, ref.size, access=mmap.ACCESS_COPY))
        except OSError:
            return None
        finally:
            os.close(fd)
        if crc32c.crc32c(view) != ref.checksum:
            return None  # rotted in place: the holder is asked, and reports it
        self.mapped_bytes += ref.size
        return view

    def close(self) -> None:
        for socket in self._sockets.values():
            socket.close(linger=0)
        self._sockets.clear()
        self._ctx.term()

    # --- one request, one reply ------------------------------------------------------

    def _ask(self, pending: dict[int, _Pending], want: _Pending) -> list[FetchFailure]:
        """Send the request; if no connection to the holder came up in time, it fails,
        and so do the requests sent to the holder before, which go with its socket."""
        address = want.ref.address
        socket = self._socket(address)
        # Only a connected holder is sent to (IMMEDIATE): a dead address is known within
        # the connect timeout, not the whole fetch timeout. Connections come up in
        # parallel, so only the first wait on a run of new holders is a real one.
        if socket.poll(int(self.connect_timeout_s * 1000), zmq.POLLOUT):
            req_id = next(self._req_ids)
            socket.send(REQUEST.pack(req_id, want.ref.key) + want.ref.store.encode(), copy=False)
            pending[req_id] = want
            return []
        # A connection that seemed up for an earlier request can be gone by now: a host
        # that died silently and booted again at the same address resets it.
        self._sockets.pop(address).close(linger=0)
        sent = [req_id for req_id, w in pending.items() if w.ref.address == address]
        failed = [want, *(pending.pop(req_id) for req_id in sent)]
        reason = self._unreachable(address)
        return [FetchFailure(w.index, w.ref, reason) for w in failed]

    def _unreachable(self, address: str) -> str:
        return f"no connection to its holder at {address} in {self.connect_timeout_s:g}s"

    def _poll(self, pending: dict[int, _Pending], timeout_ms: int) -> list[zmq.Socket]:
        poller = zmq.Poller()
        for address in {w.ref.address for w in pending.values()}:
            poller.register(self._sockets[address], zmq.POLLIN)
        return [socket for socket, _ in poller.poll(timeout_ms)]

    def _take_replies(
        self,
        socket: zmq.Socket,
        pending: dict[int, _Pending],
        blobs: list[memoryview | None],
        failures: list[FetchFailure],
    ) -> None:
        while True:
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) not in (1, 2) or len(frames[0]) != REPLY.size:
                continue  # not a reply of this protocol: the request times out instead
            req_id, code = REPLY.unpack(frames[0].bytes)
            want = pending.pop(req_id, None)
            if want is None:
                continue  # the answer to a request given up on earlier
            if code != Code.OK or len(frames) != 2:
                failures.append(FetchFailure(want.index, want.ref, _refusal(code)))
                continue
            blob = frames[1].buffer  # a view on the received frame: no copy
            problem = _check(want.ref, blob)
            if problem is None:
                blobs[want.index] = blob
                self.fetched_bytes += len(blob)
            elif want.tries < _TRIES_WHEN_CORRUPT:
                self.refetched += 1
                lost = self._ask(pending, _Pending(want.index, want.ref, want.tries + 1))
                if lost:  # the socket is closed, with whatever else it was to answer
                    failures.extend(lost)
                    return
            else:
                failures.append(FetchFailure(want.index, want.ref, problem))

    def _time_out(self, pending: dict[int, _Pending]) -> list[FetchFailure]:
        late = [
            FetchFailure(
                w.index, w.ref, f"holder at {w.ref.address} did not answer in {self.timeout_s:g}s"
            )
            for w in pending.values()
        ]
        # Requests still queued for a dead holder must not be delivered to its successor.
        for address in {w.ref.address for w in pending.values()}:
            self._sockets.pop(address).close(linger=0)
        pending.clear()
        return late

    def _socket(self, address: str) -> zmq.Socket:
        socket = self._sockets.get(address)
        if socket is None:
            socket = self._ctx.socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.IMMEDIATE, 1)
            socket.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes)
            # Holders serve with the run's payload key pair, and admit only it.
            socket.setsockopt(zmq.CURVE_SERVERKEY, self._keys.server_public)
            socket.setsockopt(zmq.CURVE_PUBLICKEY, self._keys.public)
            socket.setsockopt(zmq.CURVE_SECRETKEY, self._keys.secret)
            if address.startswith("tcp://["):
                socket.setsockopt(zmq.IPV6, 1)
            socket.connect(address)
            self._sockets[address] = socket
        return socket


def _check(ref: p.PayloadRef, blob: memoryview) -> str | None:
    if len(blob) != ref.size:
        return f"{len(blob)} bytes where the reference says {ref.size}"
    checksum = crc32c.crc32c(blob)
    if checksum != ref.checksum:
        return f"checksum {checksum:#010x} where the reference says {ref.checksum:#010x}"
    return None


def _refusal(code: int) -> str:
    if code == Code.UNKNOWN_STORE:
        return "the holder restarted since (its store is not the one referenced)"
    if code == Code.UNKNOWN_KEY:
        return "the holder no longer has it"
    return f"the holder refused the request (code {code})"
