"""Where the scheduler's loop spends its time: one cheap histogram per part of a turn.

A reply is slow when the turn it waits in is slow: a request served behind a snapshot of
the state, a long batch, a garbage collection. Each part of a turn (a request by kind,
the tick, the events, a snapshot, each generation's collections) counts its durations in
power-of-two buckets of microseconds: a few hundred nanoseconds a record, nothing kept per
request, so it is always on. The status reply carries the summary (``loop``); the scale
bench prints its slowest parts.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["Histogram", "LoopTimings"]

_BUCKETS = 32  # 2**31 µs: half an hour, longer than any turn


class Histogram:
    """Durations in power-of-two buckets of microseconds: bucket ``b`` holds those under
    ``2**b`` µs (and at least half that); quantiles are read as the bucket's upper bound."""

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total_s = 0.0
        self.longest_s = 0.0

    def add(self, seconds: float) -> None:
        micros = int(seconds * 1e6)
        self.counts[min(micros.bit_length(), _BUCKETS - 1)] += 1
        self.total_s += seconds
        self.longest_s = max(self.longest_s, seconds)

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile_us(self, q: float) -> int:
        """The upper bound of the bucket where fraction ``q`` of the durations are reached."""
        target, seen = q * self.count, 0
        for bucket, n in enumerate(self.counts):
            seen += n
            if n and seen >= target:
                return 1 << bucket
        return 0

    def summary(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "total_ms": round(self.total_s * 1e3, 1),
            "p50_us": self.quantile_us(0.5),
            "p99_us": self.quantile_us(0.99),
            "max_us": round(self.longest_s * 1e6),
        }


class LoopTimings:
    """A histogram per part of the loop's turn, and one per collector generation (timed by
    ``gc.callbacks`` while :meth:`watch_collections` is on)."""

    def __init__(self) -> None:
        self.parts: dict[str, Histogram] = {}
        self._collecting_since: float | None = None

    def add(self, part: str, seconds: float) -> None:
        histogram = self.parts.get(part)
        if histogram is None:
            histogram = self.parts[part] = Histogram()
        histogram.add(seconds)

    def summary(self) -> dict[str, dict[str, Any]]:
        return {part: h.summary() for part, h in sorted(self.parts.items())}

    def watch_collections(self) -> None:
        gc.callbacks.append(self._collection)

    def stop_watching(self) -> None:
        if self._collection in gc.callbacks:
            gc.callbacks.remove(self._collection)

    def _collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._collecting_since = time.perf_counter()
        elif self._collecting_since is not None:
            self.add(f"gc.gen{info['generation']}", time.perf_counter() - self._collecting_since)
            self._collecting_since = None
