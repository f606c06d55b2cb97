"""Where each role's time goes, and its tokens per second, over the last half minute.

Workers measure themselves: each completion's metrics carry, under ``bus.ACTIVITY_KEY``,
the microseconds its worker's loop spent in each :class:`~asyncrl.runtime.contract.bus.TimeBucket`
since that worker's previous completion, and the tokens its work covered. The service
keeps these for a sliding window and, at each train step, turns them into per-role shares
for the step's metrics line: each bucket's part of all the time the role's workers
reported in the window, so the shares of a role add up to 1. A window, not the time since
the previous step: two steps can land milliseconds apart, and a generator's completions
are not paced by steps.

A report covers the time before its completion, so near the window's start part of what
is counted happened earlier; ``reported_s`` (the seconds the reports cover, all workers
together) against ``workers`` x the window says how well the window is covered: a worker
that has completed nothing lately (stuck, or waiting a long time) has not reported it yet.
Running sums keep the work per completion and per step constant, whatever the window holds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from operator import add, sub
from typing import Any

from asyncrl.runtime.contract.bus import TimeBucket

__all__ = ["RoleActivity", "parse_activity"]

_BUCKETS = len(TimeBucket)
_KEYS = tuple(b.key for b in TimeBucket)  # in index order


def parse_activity(activity: Any) -> tuple[int, list[int]] | None:
    """(tokens, microseconds per bucket) from a completion's activity; None if malformed."""
    if not isinstance(activity, dict):  # what the wire decodes a map to
        return None
    spent = activity.get("us")
    if type(spent) is not list or len(spent) != _BUCKETS:
        return None
    for us in spent:  # a measure: never trusted blindly
        if type(us) is not int or us < 0:
            return None
    tokens = activity.get("tokens")
    return (tokens if type(tokens) is int and tokens >= 0 else 0), spent


class _Sums:
    """A role's totals over the window, in whole microseconds: adding and taking away
    again leaves exactly nothing behind."""

    __slots__ = ("tokens", "us")

    def __init__(self) -> None:
        self.tokens = 0
        self.us = [0] * _BUCKETS


class RoleActivity:
    def __init__(self, now: float, window_s: float = 30.0) -> None:
        self._started = now
        self.window_s = window_s
        self._seen: deque[tuple[float, _Sums, int, list[int]]] = deque()
        self._sums: dict[str, _Sums] = {}

    def add(self, role: str, activity: Any, now: float) -> None:
        """Count one completion's ``activity``; anything malformed is ignored (it is a measure)."""
        parsed = parse_activity(activity)
        if parsed is None:
            return
        tokens, spent = parsed
        sums = self._sums.get(role)
        if sums is None:
            sums = self._sums[role] = _Sums()
        sums.tokens += tokens
        sums.us = list(map(add, sums.us, spent))
        self._seen.append((now, sums, tokens, spent))

    def rates(self, now: float, workers: Mapping[str, int]) -> dict[str, dict[str, float]]:
        """Per role that reports activity and has workers: tokens/s over the window, the
        share of each bucket in the time reported, that time, and the workers counted."""
        self._forget_before(now - self.window_s)
        span = max(min(self.window_s, now - self._started), 1e-9)
        out: dict[str, dict[str, float]] = {}
        for role in sorted(self._sums):
            count = workers.get(role, 0)
            if count <= 0:
                continue
            sums = self._sums[role]
            total = sum(sums.us)
            line: dict[str, float] = {"workers": count}
            line["tokens_per_s"] = round(sums.tokens / span, 1)
            if total > 0:
                shares = zip(_KEYS, sums.us, strict=True)
                line.update((key, round(us / total, 4)) for key, us in shares)
            line["reported_s"] = round(total / 1e6, 3)
            out[role] = line
        return out

    def _forget_before(self, cutoff: float) -> None:
        seen = self._seen
        while seen and seen[0][0] < cutoff:
            _, sums, tokens, spent = seen.popleft()
            sums.tokens -= tokens
            sums.us = list(map(sub, sums.us, spent))
