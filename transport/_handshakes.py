"""Who was refused at the door: the ZAP authenticator and the reading of handshake failures.

The scheduler's sockets report failed handshakes through socket monitors, and the ZAP
authenticator notes every key it refuses; ``BoundSockets.auth_failures()`` (sockets.py)
gathers both into lines the scheduler logs.
"""

from __future__ import annotations

import collections

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

__all__ = ["HANDSHAKE_FAILURES", "ZAP_DOMAINS", "CurveGuard", "read_monitor"]

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
_MAX_UNREAD_FAILURES = 1000  # a client retrying a bad key must not grow memory without end
_PROTOCOL_ERRORS = {
    int(getattr(zmq, name)): name.removeprefix("PROTOCOL_ERROR_")
    for name in dir(zmq)
    if name.startswith("PROTOCOL_ERROR_")
}
_PROTOCOL_HINTS = {
    int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): "a client without CURVE keys?",
    int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC): "a client with the wrong server public key?",
}


class CurveGuard:
    """The ZAP authenticator: admits only the allowed client keys and notes every refusal."""

    def __init__(self, ctx: zmq.Context, allowed: frozenset[bytes]) -> None:
        self._allowed = allowed
        self._domains = {v.decode(): k for k, v in ZAP_DOMAINS.items()}
        self._denied: collections.deque[str] = collections.deque(maxlen=_MAX_UNREAD_FAILURES)
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        for domain in self._domains:
            self._auth.configure_curve_callback(domain, credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        """Called by the authenticator's thread for every CURVE handshake."""
        if key in self._allowed:
            return True
        socket = self._domains.get(domain, domain)
        self._denied.append(f"{socket}: refused a client whose key {key.decode()} is not allowed")
        return False

    def take_denied(self) -> list[str]:
        taken = []
        while self._denied:
            taken.append(self._denied.popleft())
        return taken

    def stop(self) -> None:
        self._auth.stop()


def read_monitor(name: str, monitor: zmq.Socket) -> list[str]:
    found = []
    while True:
        try:
            event = recv_monitor_message(monitor, zmq.NOBLOCK)
        except zmq.Again:
            return found
        description = _describe_failure(int(event["event"]), int(event["value"]))
        if description is not None:
            found.append(f"{name}: {description}")


def _describe_failure(event: int, value: int) -> str | None:
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        # A denial (400) comes from CurveGuard.callback, which already noted it with the key.
        if value == _ZAP_DENIED:
            return None
        return f"refused a client: the authenticator answered {value}"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        name = _PROTOCOL_ERRORS.get(value, hex(value))
        hint = _PROTOCOL_HINTS.get(value)
        return f"refused a client: handshake error {name}" + (f" ({hint})" if hint else "")
    # The client saw the problem first (no CURVE keys, say) and hung up, or it timed out.
    return "a client's handshake failed with no detail (the client hung up or timed out)"
