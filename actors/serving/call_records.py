"""What a session's calls sampled, kept by the server that served them until collected.

Every call a harness makes through a session's URL is recorded as the decoder made it:
the prompt's token ids, each sampled token's id, behaviour log-prob and policy version.
Training reads these, never text tokenised again. The harness's worker collects a
session's records once the harness returns (``GET /sessions/<sid>/record``, which frees
them); a session nobody collects within ``ttl_s`` of its last call is dropped and counted,
so records cannot pile up in a generator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
import structlog

__all__ = ["CallRecord", "SessionRecords", "decode_records", "encode_records"]

log = structlog.get_logger("asyncrl.serving")


class CallRecord(msgspec.Struct, frozen=True):
    """One model call of a session, exactly as sampled."""

    prompt_ids: list[int]
    completion_ids: list[int]  # every sampled token, the one that ended it included
    logprobs: list[float]  # the behaviour log-prob of each completion token
    versions: list[int]  # the policy version each completion token was sampled under
    truncated: bool  # the length limit, not an end or stop token, ended it


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(list[CallRecord])


def encode_records(calls: list[CallRecord]) -> bytes:
    return _ENCODER.encode(calls)


def decode_records(body: bytes) -> list[CallRecord]:
    """A session's records from the server's reply; msgspec.ValidationError if malformed."""
    return _DECODER.decode(body)


class SessionRecords:
    """Sessions' calls in order, by session id; safe to use from any thread."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.dropped = 0  # sessions dropped uncollected
        self._lock = threading.Lock()
        self._calls: dict[str, list[CallRecord]] = {}
        self._touched: dict[str, float] = {}

    def add(self, session: str, call: CallRecord) -> None:
        with self._lock:
            self._sweep()
            self._calls.setdefault(session, []).append(call)
            self._touched[session] = self.clock()

    def take(self, session: str) -> list[CallRecord]:
        """The session's calls, oldest first, forgotten here (none if it made none)."""
        with self._lock:
            self._touched.pop(session, None)
            return self._calls.pop(session, [])

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    def _sweep(self) -> None:
        cutoff = self.clock() - self.ttl_s
        stale = [s for s, at in self._touched.items() if at < cutoff]
        for session in stale:
            del self._calls[session], self._touched[session]
        if stale:
            self.dropped += len(stale)
            log.warning(
                "session records dropped uncollected", sessions=len(stale), total=self.dropped
            )
