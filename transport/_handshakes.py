"""Who was refused at the door: the ZAP authenticator and the reading of handshake failures.

The scheduler's sockets report failed handshakes through socket monitors, and the ZAP
authenticator notes every key it refuses; ``BoundSockets.auth_failures()`` (sockets.py)
gathers both into lines the scheduler logs.

Those lines are bounded: a client dialling with fresh random keys is refused thousands of
times a second, and a line for each would fill the disk. :class:`Refusals` lets the first
few refusals of each kind in an interval through as they are, with their detail (the one
misconfigured worker is named), and sums up the rest once the interval is over: "refused
9,812 connections in 10 s (bad CURVE key)".
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

__all__ = ["HANDSHAKE_FAILURES", "ZAP_DOMAINS", "CurveGuard", "Refusals", "read_monitor"]

ZAP_DOMAINS = {
    "control": b"asyncrl.control",
    "events": b"asyncrl.events",
    "payloads": b"asyncrl.payloads",  # a worker's data-plane server (dataplane/server.py)
}
HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_ZAP_DENIED = 400
BAD_KEY = "bad CURVE key"
NO_DETAIL = "handshake failed with no detail"
_PROTOCOL_ERRORS = {
    int(getattr(zmq, name)): name.removeprefix("PROTOCOL_ERROR_")
    for name in dir(zmq)
    if name.startswith("PROTOCOL_ERROR_")
}
_PROTOCOL_HINTS = {
    int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): "a client without CURVE keys?",
    int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC): "a client with the wrong server public key?",
}


class Refusals:
    """Refused handshakes, tallied by kind, told as at most ``detailed`` lines per kind and
    ``interval_s`` plus one sum per kind for the rest. Thread-safe: the authenticator's
    thread notes, the scheduler's loop reports."""

    def __init__(
        self,
        interval_s: float = 10.0,
        detailed: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.detailed = detailed
        self._clock = clock
        self._lock = threading.Lock()
        self._since = clock()
        self._counts: collections.Counter[str] = collections.Counter()
        self._lines: list[str] = []  # detailed lines not yet reported

    def note(self, kind: str, detail: str) -> None:
        """One refusal of ``kind``; ``detail`` says who and how, for the first few."""
        with self._lock:
            self._counts[kind] += 1
            if self._counts[kind] <= self.detailed:
                self._lines.append(detail)

    def report(self) -> list[str]:
        """The lines to log now: the detailed ones since the last call, and once an
        interval is over, a sum for each kind that had more refusals than were detailed."""
        now = self._clock()
        with self._lock:
            lines, self._lines = self._lines, []
            if now - self._since < self.interval_s:
                return lines
            elapsed = now - self._since
            for kind, count in sorted(self._counts.items()):
                if count > self.detailed:
                    lines.append(f"refused {count:,} connections in {elapsed:.0f} s ({kind})")
            self._counts.clear()
            self._since = now
        return lines


class CurveGuard:
    """The ZAP authenticator: admits only the allowed client keys and notes every refusal
    in ``refusals``."""

    def __init__(
        self, ctx: zmq.Context, allowed: frozenset[bytes], refusals: Refusals | None = None
    ) -> None:
        self._allowed = allowed
        self._domains = {v.decode(): k for k, v in ZAP_DOMAINS.items()}
        self.refusals = refusals if refusals is not None else Refusals()
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        for domain in self._domains:
            self._auth.configure_curve_callback(domain, credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """Called by the authenticator's thread for every CURVE handshake."""
        if key in self._allowed:
            return True
        socket = self._domains.get(domain, domain)
        detail = f"{socket}: refused a client whose key {key.decode()} is not allowed"
        self.refusals.note(BAD_KEY, detail)
        return False

    def stop(self) -> None:
        self._auth.stop()


def read_monitor(name: str, monitor: zmq.Socket, refusals: Refusals) -> None:
    """Note in ``refusals`` every failed handshake ``monitor`` (of socket ``name``) saw."""
    while True:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        failure = _describe_failure(int(event["event"]), int(event["value"]))
        if failure is not None:
            kind, description = failure
            refusals.note(kind, f"{name}: {description}")


def _describe_failure(event: int, value: int) -> tuple[str, str] | None:
    """The kind of a failed handshake and a description of it; None for one already noted."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        # A denial (400) comes from CurveGuard.callback, which already noted it with the key.
        if value == _ZAP_DENIED:
            return None
        return (
            f"authenticator answered {value}",
            f"refused a client: the authenticator answered {value}",
        )
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        name = _PROTOCOL_ERRORS.get(value, hex(value))
        hint = _PROTOCOL_HINTS.get(value)
        kind = f"handshake error {name}"
        return kind, f"refused a client: {kind}" + (f" ({hint})" if hint else "")
    # The client saw the problem first (no CURVE keys, say) and hung up, or it timed out.
    return NO_DETAIL, "a client's handshake failed with no detail (the client hung up or timed out)"
