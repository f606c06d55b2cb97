"""How busy each role is: tokens per second and idle fraction, over the last half minute.

Workers measure themselves: each completion's metrics carry, under ``bus.ACTIVITY_KEY``,
the seconds spent working since the worker's previous completion and the tokens that
work covered. The service
keeps these for a sliding window and, at each train step, turns them into per-role rates
for the step's metrics line. A window, not the time since the previous step: two steps
can land milliseconds apart, and a generator's completions are not paced by steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

__all__ = ["RoleActivity"]


class RoleActivity:
    def __init__(self, now: float, window_s: float = 30.0) -> None:
        self._started = now
        self.window_s = window_s
        self._seen: deque[tuple[float, str, float, int]] = deque()  # (when, role, busy, tokens)
        self._roles: set[str] = set()

    def add(self, role: str, activity: Any, now: float) -> None:
        """Count one completion's ``activity``; anything malformed is ignored (it is a measure)."""
        if not isinstance(activity, Mapping):
            return
        busy, tokens = activity.get("busy_s"), activity.get("tokens")
        busy = float(busy) if isinstance(busy, int | float) and busy >= 0 else 0.0
        tokens = tokens if isinstance(tokens, int) and tokens >= 0 else 0
        self._seen.append((now, role, busy, tokens))
        self._roles.add(role)

    def rates(self, now: float, workers: Mapping[str, int]) -> dict[str, dict[str, float]]:
        """Per role that reports activity: tokens/s and idle fraction over the window."""
        while self._seen and self._seen[0][0] < now - self.window_s:
            self._seen.popleft()
        span = max(min(self.window_s, now - self._started), 1e-9)
        busy: dict[str, float] = dict.fromkeys(self._roles, 0.0)
        tokens: dict[str, int] = dict.fromkeys(self._roles, 0)
        for _, role, b, t in self._seen:
            busy[role] += b
            tokens[role] += t
        out = {}
        for role in sorted(self._roles):
            count = workers.get(role, 0)
            if count <= 0:
                continue
            out[role] = {
                "tokens_per_s": round(tokens[role] / span, 1),
                "idle_frac": round(max(0.0, 1.0 - busy[role] / (span * count)), 3),
            }
        return out
