"""The scheduler process's loop: the service behind a ROUTER and a PUB socket.

One thread owns both sockets. Each turn it reads every request waiting on the ROUTER
(so one journal batch covers them all: group commit), hands them to the service, hands the
new records to the journal, sends each reply whose records are journaled, then publishes
the events. A long turn (a burst: every follower of a new version asking at once) has the
journal write every millisecond or so, so a reply held for it does not wait for the whole
turn. A reply that owes nothing to the journal (a lease) is sent before the service
journals and announces what the request changed, so a worker's wait for it excludes that
bookkeeping; the bookkeeping is still done before the next request is answered.

With ``ack_after: write`` the journal writes the batch in that call, so held replies go
out in the same turn, and fsyncs it within ``journal_fsync_interval_ms`` (or
once ``journal_fsync_every`` records are unsynced) rather than once per turn. Replies that
wait for an fsync (``ack_after: fsync``, or a batch queued behind a snapshot's disk work)
are held in order and released when the log thread reports progress (it writes to an
eventfd the poller watches), so a slow fsync delays only those replies, never the loop.
After a turn that served requests the loop polls without sleeping for ``busy_poll_s``
before it sleeps (see sockets.busy_poll), while the next request has lately come within
that time (sockets.AdaptiveSpin): an idle scheduler sleeps, a busy one stays awake, and
one whose requests come far apart does not burn a core waiting for them. How long each
part of a turn takes is counted in the service's loop timings (loop_timings.py).

Wire form (ROUTER side): ``[identity, header, *arrays]`` in and out; events on the PUB as
``[topic, header, *arrays]`` (see transport/protocol.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import structlog
import zmq

from asyncrl.runtime.scheduler.journal import JournalWriter
from asyncrl.transport import protocol as p
from asyncrl.transport.sockets import AdaptiveSpin, busy_poll, recv_waiting, send_frames

from .connections import Connections
from .service import ACKNOWLEDGES_DATA, SchedulerService

__all__ = ["SchedulerDaemon"]

log = structlog.get_logger("asyncrl.scheduler")

_BATCH = 512  # requests read per turn before the loop publishes and replies
# A reply held for the journal waits at most this long for the rest of its batch: in a
# burst (a version's followers all asking at once) one turn read 110 to 320 requests in
# 2.5 to 24 ms (the scale bench at 1,024 workers), and a Complete read first would wait
# for all of it. Writing sooner costs a write per _HOLD_S, and only in a burst.
_HOLD_S = 0.001
_POLLIN = int(zmq.POLLIN)
_DETAIL = 200  # characters of a protocol error kept in its log line
_FAILED = p.Error("internal", "the scheduler failed on this request")


class SchedulerDaemon:
    def __init__(
        self,
        service: SchedulerService,
        router: zmq.Socket[Any],
        pub: zmq.Socket[Any],
        wake_fd: int,
        *,
        ack_after: Literal["write", "fsync"] = "write",
        tick_interval_s: float = 0.1,
        busy_poll_s: float = 0.0,
        exit_grace_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        auth_failures: Callable[[], list[str]] | None = None,
        on_tick: Callable[[float], None] | None = None,
        connections: Connections | None = None,
    ) -> None:
        self.service = service
        # Who may speak for which worker (connections.py); without the run secret, a
        # worker restarted under a live name waits for the old registration to go.
        self.connections = connections or Connections(service.core)
        self.router = router
        self.pub = pub
        self.wake_fd = wake_fd
        self.ack_after = ack_after
        self.tick_interval_s = tick_interval_s
        self.busy_poll_s = busy_poll_s
        self._spin = AdaptiveSpin(busy_poll_s)
        self.exit_grace_s = exit_grace_s
        self.clock = clock
        self.auth_failures = auth_failures
        self.on_tick = on_tick  # e.g. the /metrics snapshot, on this thread
        self.timings = service.timings
        self._stops = 0  # stop signals so far: the first drains, the second ends the loop
        self._held: deque[tuple[int, list[Any]]] = deque()  # (journal seq, reply frames)
        self._held_since = 0.0  # when the oldest held reply was held (perf_counter)
        self._draining_since: float | None = None

    def request_stop(self) -> None:
        """From a signal handler: drain at the first call, stop at once at the second."""
        self._stops += 1
        os.eventfd_write(self.wake_fd, 1)

    def run(self) -> int:
        self.timings.watch_collections()  # a collection pauses whatever request is in flight
        try:
            return self._run()
        finally:
            self.timings.stop_watching()

    def _run(self) -> int:
        # zmq_poll itself, not zmq.Poller: the Poller rebuilds its list and a dict per call,
        # once per request here. Items are (socket or fd, events); results the same.
        watched = [(self.router, _POLLIN), (self.wake_fd, _POLLIN)]
        next_tick = self.clock()
        requests = False
        served_at: float | None = None
        while True:
            # Right after serving, the next request is often on its way (a worker's complete
            # follows its claim): wait for it awake for a moment rather than asleep, while
            # that has lately paid (AdaptiveSpin).
            spin = self._spin.next_spin_s() if requests else 0.0
            ready = busy_poll(watched, spin) or zmq.zmq_poll(watched, self._poll_ms(next_tick))
            woken = requests = False
            for which, _events in ready:
                if which is self.router:
                    requests = True
                else:
                    woken = True
            if woken:
                with contextlib.suppress(BlockingIOError):  # another read took it
                    os.eventfd_read(self.wake_fd)
            if requests:
                if served_at is not None:
                    self._spin.record(time.perf_counter() - served_at)
                self._serve_batch()
                served_at = time.perf_counter()
            now = self.clock()
            if now >= next_tick:
                began = time.perf_counter()
                self.service.tick(now)
                if self.on_tick is not None:
                    self.on_tick(now)
                self.connections.forget_gone()
                self._log_auth_failures()
                # Records no reply waits on (leases, renewals) still reach the disk in time.
                self.service.durable.writer.flush_if_due()
                next_tick = now + self.tick_interval_s
                self.timings.add("tick", time.perf_counter() - began)
            if self._held:
                self._write_held()
            # After the replies: a worker waits on its reply, while events are wake-ups.
            began = time.perf_counter()
            self._publish()
            self.timings.add("publish", time.perf_counter() - began)
            if self._should_exit(now):
                return 0

    def _poll_ms(self, next_tick: float) -> int:
        return max(0, int((next_tick - self.clock()) * 1000) + 1)

    # --- requests --------------------------------------------------------------------

    def _serve_batch(self) -> None:
        writer, timings = self.service.durable.writer, self.timings
        began = time.perf_counter()
        for i in range(_BATCH):
            frames = recv_waiting(self.router, polled=i == 0)  # the poll said so for the first
            if frames is None:
                break
            self._serve_one(frames, writer)
            if self._held and time.perf_counter() - self._held_since > _HOLD_S:
                self._write_held()  # a long batch: its first replies go out now
        timings.add("batch", time.perf_counter() - began)

    def _serve_one(self, frames: list[Any], writer: JournalWriter) -> None:
        """Answer one request, its reply sent or held for the journal, its changes settled."""
        durable = self.service.durable
        began, snapshots = time.perf_counter(), durable.snapshots_started
        kind = self._serve(frames, writer)
        took = time.perf_counter() - began
        self.timings.add(f"request.{kind.name if kind else 'refused'}", took)
        if durable.snapshots_started != snapshots:  # its commit began a snapshot (a fork)
            self.timings.add("snapshot", took)

    def _serve(self, frames: list[Any], writer: JournalWriter) -> p.Kind | None:
        identity, body = frames[0], [f.buffer for f in frames[1:]]
        reply, req_id, kind = self._answer(body, identity.bytes)
        out = [identity, *_encoded(reply, req_id, kind)]
        acknowledges = kind in ACKNOWLEDGES_DATA
        if acknowledges:
            self.service.settle()  # its records reach the journal's buffer first
            if writer.last_seq > self._confirmed():
                if not self._held:
                    self._held_since = time.perf_counter()
                self._held.append((writer.last_seq, out))
                return kind
        if self._held:
            self._held.append((0, out))  # keep replies in order behind held ones
        else:
            self._send(out)
        if not acknowledges:
            # The reply owes nothing to the journal: it is on its way before this.
            self.service.settle()
        return kind

    def _answer(self, frames: list[Any], sender: bytes) -> tuple[p.Message, int, p.Kind | None]:
        size = sum(f.nbytes for f in frames)
        limit = self.service.terms.max_message_bytes
        if size > limit:  # libzmq bounds each frame; the sum is bounded here
            detail = f"message of {size} bytes exceeds scheduler.max_message_mb ({limit} bytes)"
            log.warning("bad message", detail=detail)
            return self.service.protocol_error(detail), p.request_id(frames), None
        try:
            message, req_id = p.decode_with_id(frames)
        except p.ProtocolError as error:
            detail = str(error)[:_DETAIL]
            log.warning("bad message", detail=detail)
            return self.service.protocol_error(detail), error.req_id, None
        except Exception:  # a bug in decoding, which should say ProtocolError
            log.exception("request failed to decode")
            return _FAILED, p.request_id(frames), None
        try:
            # The connection is the identity: a request about a worker (its registration,
            # its leases, its reports, its goodbye) counts only from that worker's own
            # connection.
            refused = self.connections.refusal(message, sender)
            if refused is not None:
                return refused, req_id, None
            reply = self.service.answer(message, self.clock())
            self.connections.answered(message, reply, sender)
            return reply, req_id, message.KIND
        except Exception:
            # A bug, not bad input: the request fails, the scheduler and the run go on.
            log.exception("request failed", kind=message.KIND.name)
            return _FAILED, req_id, None

    def _write_held(self) -> None:
        """Have the journal write what the held replies wait for, and send those it
        confirms."""
        began = time.perf_counter()
        # Usually written when this returns (see JournalWriter). A reply that waits only
        # for the write leaves the fsync to the journal's batching rule.
        self.service.durable.writer.submit(durable=self.ack_after == "fsync")
        self._release()
        now = time.perf_counter()
        self._held_since = now  # those still held (waiting for an fsync) wait anew
        self.timings.add("journal_write", now - began)

    def _confirmed(self) -> int:
        writer = self.service.durable.writer
        return writer.written_seq if self.ack_after == "write" else writer.durable_seq

    def _release(self) -> None:
        confirmed = self._confirmed()
        held = self._held
        while held and held[0][0] <= confirmed:
            self._send(held.popleft()[1])

    def _send(self, frames: list[Any]) -> None:
        try:
            send_frames(self.router, frames)
        except zmq.ZMQError as error:  # the peer is gone; it will time out and retry
            log.info("reply not delivered", error=str(error))

    # --- events and the end ----------------------------------------------------------

    def _publish(self) -> None:
        for event in self.service.take_events():
            try:
                frames = p.encode(event)
            except Exception:  # a bug: that event is lost, the loop and the run go on
                log.exception("event failed to encode", topic=event.topic, seq=event.seq)
                continue
            send_frames(self.pub, [event.topic.encode(), *frames])

    def _log_auth_failures(self) -> None:
        if self.auth_failures is not None:
            for failure in self.auth_failures():
                log.warning("client rejected", detail=failure)

    def _should_exit(self, now: float) -> bool:
        service = self.service
        if self._stops:
            service.drain("stop signal")
        if self._stops > 1:
            log.warning("second stop signal: exiting without waiting for leases")
            return True
        if service.draining is None:
            return False
        if self._draining_since is None:
            self._draining_since = now
        if self._held or not service.idle:
            return False
        if service.awaits_final_validation and not self._stops:
            return False
        workers_gone = not service.core.state.workers
        return workers_gone or now - self._draining_since >= self.exit_grace_s


def _encoded(reply: p.Message, req_id: int, kind: p.Kind | None) -> list[bytes | memoryview]:
    """``reply``'s frames; a reply that cannot be sent (a bug) is the request's Error."""
    try:
        return p.encode(reply, req_id)
    except Exception:
        request = None if kind is None else kind.name
        log.exception("reply failed to encode", kind=request, reply=reply.KIND.name)
        return p.encode(_FAILED, req_id)
