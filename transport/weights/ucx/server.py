"""Serve byte ranges of the versions a node holds to the receivers that ask for them.

One thread per node. A request names a version and a range; where the node holds the
run's key, one without a good MAC, or seen before, is dropped unanswered (..mac). It is
answered from the slot holding that version as soon as the range is there (a relay may
still be receiving it), or answered GONE if the version is no longer held (a header and
an empty body, so the asker is left waiting on nothing). A send that does not complete by
its deadline, or that reads a slot the writer revoked, is cancelled by closing its
endpoint; the receiver notices by its own deadline and asks elsewhere.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import structlog

from ..mac import Refused, RequestGuard
from .node import Request, UcxNode
from .store import Store
from .wire import (
    CONTROL_BYTES,
    REQUEST_TAG,
    RangeRequest,
    Status,
    WireError,
    decode_request,
    encode_header,
)

__all__ = ["Server"]

log = structlog.get_logger("asyncrl.weights")

_SENDING_POLL_S = 0.0005
_IDLE_POLL_S = 0.02


@dataclass(slots=True)
class _Waiting:
    request: RangeRequest
    slot: int
    deadline: float


@dataclass(slots=True)
class _Sending:
    request: RangeRequest
    slot: int | None  # None: an answer without bytes
    pending: list[Request]
    deadline: float
    generation: int  # of our endpoint to the receiver that the sends went on


class Server:
    def __init__(
        self, node: UcxNode, store: Store, send_timeout_s: float, key: bytes | None = None
    ) -> None:
        self.node, self.store = node, store
        self.guard = RequestGuard(key, node.address, log.warning)
        self.send_timeout_s = send_timeout_s
        self.served_bytes = 0
        self._waiting: list[_Waiting] = []
        self._early: list[tuple[RangeRequest, float]] = []  # for a version not yet begun
        self._sending: list[_Sending] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="weights-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self.store.changed:
            self.store.changed.notify_all()
        self._thread.join(timeout=5)

    # --- the loop --------------------------------------------------------------------

    def _run(self) -> None:
        frame = np.zeros(CONTROL_BYTES, np.uint8)
        incoming = self.node.recv_any(frame, REQUEST_TAG)
        while not self._stop.is_set():
            try:
                incoming, frame = self._turn(incoming, frame)
            except Exception:
                # This thread answers every receiver of this node: were it to end, each of
                # them would wait out its stall timeout against it, again and again, for
                # as long as the process lives. One request's error costs only that one.
                log.exception("weight server error; serving on")
                time.sleep(_IDLE_POLL_S)

    def _turn(self, incoming: Request, frame: np.ndarray) -> tuple[Request, np.ndarray]:
        busy = False
        if incoming.completed:
            busy = True
            taken, frame = (incoming, frame), np.zeros(CONTROL_BYTES, np.uint8)
            incoming = self.node.recv_any(frame, REQUEST_TAG)  # first: a bad one is dropped
            self._take(*taken)
        with self.store.changed:
            busy |= self._step(time.monotonic())
            if not busy:
                # Sends in flight and new requests complete inside UCX, which cannot
                # notify this condition: poll sends fast, and otherwise slowly, since this
                # thread shares its process's GIL and cores with decoding or training (a
                # fetch asks for four ranges at once, so one slow first answer costs little).
                self.store.changed.wait(_SENDING_POLL_S if self._sending else _IDLE_POLL_S)
        return incoming, frame

    def _take(self, incoming: Request, frame: np.ndarray) -> None:
        try:
            incoming.check_error()
            request = decode_request(frame, self.guard.verify)
            self.guard.admit(request.address, request.sequence)
        except Refused as error:  # no answer: the address it names is not to be trusted
            self.guard.note(error)
            return
        except (WireError, Exception) as error:  # a truncated or foreign message
            log.warning("weight request dropped", reason=str(error)[:200])
            return
        # Answers from the endpoint that pairs with the one the receiver asked over.
        self.node.peer_generation(request.address, request.generation)
        with self.store.changed:
            deadline = time.monotonic() + self.send_timeout_s
            if not self._open(request, deadline):
                if self.store.expecting == request.version:
                    self._early.append((request, deadline))
                else:
                    self._reply(request, Status.GONE, f"version {request.version} not held")

    def _open(self, request: RangeRequest, deadline: float) -> bool:
        """Start serving ``request`` from the slot holding its version, if one does."""
        slot = self.store.pool.open_read(request.version)
        if slot is None:
            return False
        if request.end > self._size(slot):
            self.store.pool.close_read(slot)
            self._reply(request, Status.BAD_REQUEST, f"range ends past {self._size(slot)}")
        else:
            self._waiting.append(_Waiting(request, slot, deadline))
        return True

    def _size(self, slot: int) -> int:
        buffer = self.store.buffers[slot]
        return 0 if buffer is None else buffer.size

    def _step(self, now: float) -> bool:
        """Start what can start, finish what finished, cancel what must stop."""
        pool, progressed = self.store.pool, False
        early, self._early = self._early, []
        for request, deadline in early:
            if self._open(request, deadline):
                progressed = True
            elif self.store.expecting != request.version or now >= deadline:
                self._reply(request, Status.GONE, f"version {request.version} not held")
                progressed = True
            else:
                self._early.append((request, deadline))
        still: list[_Waiting] = []
        for w in self._waiting:
            readable = pool.readable(w.slot, w.request.version)
            if readable is None or now >= w.deadline:
                pool.close_read(w.slot)
                self._reply(w.request, Status.GONE, f"version {w.request.version} withdrawn")
                progressed = True
            elif readable >= w.request.end:
                self._send(w)
                progressed = True
            else:
                still.append(w)
        self._waiting = still
        revoked = set(pool.revoked())
        running: list[_Sending] = []
        for s in self._sending:
            if all(r.completed for r in s.pending):
                failed = _failed(s.pending)
                if failed:
                    # A failed endpoint stays failed (UCX reports nothing without error
                    # handling): the next answer to this receiver goes on a new one.
                    self.node.drop(s.request.address, s.generation)
                    log.info("weight send failed", reason=failed)
                elif s.slot is not None:
                    self.served_bytes += s.request.end - s.request.start
                self._release(s)
                progressed = True
            elif now >= s.deadline or s.slot in revoked:
                # Closing the endpoint cancels the send; the receiver's deadline finds out.
                self.node.drop(s.request.address, s.generation)
                log.info(
                    "weight send cancelled",
                    version=s.request.version,
                    reason="revoked" if s.slot in revoked else "timed out",
                )
                self._release(s)
                progressed = True
            else:
                running.append(s)
        self._sending = running
        if progressed:
            self.store.changed.notify_all()
        return progressed

    def _send(self, w: _Waiting) -> None:
        r = w.request
        buffer = self.store.buffers[w.slot]
        assert buffer is not None
        try:
            header = self.node.send(r.address, encode_header(Status.OK), r.reply_tag)
            data = self.node.send(r.address, buffer[r.start : r.end], r.reply_tag + 1)
        except Exception as error:  # an address UCX cannot reach
            log.warning("weight send not started", reason=str(error)[:200])
            self.store.pool.close_read(w.slot)
            return
        deadline = time.monotonic() + self.send_timeout_s
        generation = self.node.generation(r.address)
        self._sending.append(_Sending(r, w.slot, [header, data], deadline, generation))

    def _reply(self, request: RangeRequest, status: Status, detail: str) -> None:
        """A header that says no, and an empty body: the asker posted a receive for the
        bytes, and only an answer ends it at once, so it moves on at once (wire.py)."""
        pending: list[Request] = []
        try:
            header = encode_header(status, detail)
            pending.append(self.node.send(request.address, header, request.reply_tag))
            empty = np.zeros(0, np.uint8)
            pending.append(self.node.send(request.address, empty, request.reply_tag + 1))
        except Exception as error:
            log.warning("weight reply not sent", reason=str(error)[:200])
        if pending:
            deadline = time.monotonic() + self.send_timeout_s
            generation = self.node.generation(request.address)
            self._sending.append(_Sending(request, None, pending, deadline, generation))

    def _release(self, s: _Sending) -> None:
        if s.slot is not None:
            self.store.pool.close_read(s.slot)


def _failed(requests: list[Request]) -> str:
    for request in requests:
        try:
            request.check_error()
        except Exception as error:
            return str(error)[:200]
    return ""
