"""The scheduler in the worker's own process: the same service, no sockets.

For fast tests. Each link encodes and decodes every message as
the wire would (so a role that works here sends only what the protocol allows) and calls
the service under one lock; a ticker thread expires leases and silent workers. Events go
to every link whose subscriptions match, through a bounded queue, like a SUB socket.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.scheduler.service.assembly import open_service
from asyncrl.transport import protocol as p
from asyncrl.transport.link import LinkClosed

__all__ = ["InProcessHub"]


class InProcessHub:
    def __init__(
        self,
        cfg: RunConfig,
        *,
        resume: bool = False,
        clock: Callable[[], float] = time.monotonic,
        tick_interval_s: float = 0.05,
    ) -> None:
        self.clock = clock
        self.service = open_service(cfg, resume=resume, now=clock())
        self._lock = threading.Lock()
        self._links: list[_HubLink] = []
        self._closed = threading.Event()
        self._ticker = threading.Thread(
            target=self._tick_loop, args=(tick_interval_s,), name="hub-ticker", daemon=True
        )
        self._ticker.start()

    def link(self) -> _HubLink:
        link = _HubLink(self)
        with self._lock:
            self._links.append(link)
        return link

    def call(self, message: p.Message) -> p.Message:
        with self._lock:
            if self._closed.is_set():
                raise LinkClosed("the in-process scheduler is closed")
            reply = self.service.handle(message, self.clock())
            self._fan_out()
        return reply

    def _fan_out(self) -> None:
        for event in self.service.take_events():
            for link in self._links:
                link.offer(event)

    def _tick_loop(self, interval: float) -> None:
        while not self._closed.wait(interval):
            with self._lock:
                self.service.tick(self.clock())
                self._fan_out()

    def close(self) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self.service.durable.close()
            self.service.close_files()
        self._ticker.join()


class _HubLink:
    """A SchedulerLink onto an InProcessHub."""

    def __init__(self, hub: InProcessHub, max_events: int = 10_000) -> None:
        self._hub = hub
        self._prefixes: tuple[str, ...] = ()
        self._events: queue.Queue[p.Event] = queue.Queue(max_events)
        self.dropped_events = 0

    def request(self, message: p.Message, timeout_s: float) -> p.Message:
        wire = p.decode(p.encode(message))  # exactly what a socket would carry
        return p.decode(p.encode(self._hub.call(wire)))

    def subscribe(self, prefixes: Sequence[str]) -> None:
        self._prefixes = (*self._prefixes, *prefixes)

    def offer(self, event: p.Event) -> None:
        if not event.topic.startswith(self._prefixes):
            return
        try:
            self._events.put_nowait(event)
        except queue.Full:
            self.dropped_events += 1  # events are wake-ups; the worker also polls

    def next_event(self, timeout_s: float) -> p.Event | None:
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        with self._hub._lock:
            if self in self._hub._links:
                self._hub._links.remove(self)
