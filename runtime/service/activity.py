"""How busy each role is: tokens per second and idle fraction, between two train steps.

Workers measure themselves: each completion carries ``activity`` (seconds spent working
since the worker's previous completion, and the tokens that work covered). The service
adds these up per role and, at each train step, turns them into rates over the time since
the previous step, for the step's metrics line.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

__all__ = ["ACTIVITY_KEY", "RoleActivity"]

ACTIVITY_KEY = "activity"  # in Complete.metrics: {"busy_s": float, "tokens": int}


class RoleActivity:
    def __init__(self, now: float) -> None:
        self._since = now
        self._busy: dict[str, float] = defaultdict(float)
        self._tokens: dict[str, int] = defaultdict(int)

    def add(self, role: str, activity: Any) -> None:
        """Count one completion's ``activity``; anything malformed is ignored (it is a measure)."""
        if not isinstance(activity, Mapping):
            return
        busy, tokens = activity.get("busy_s"), activity.get("tokens")
        if isinstance(busy, int | float) and busy >= 0:
            self._busy[role] += float(busy)
        if isinstance(tokens, int) and tokens >= 0:
            self._tokens[role] += tokens

    def take(self, now: float, workers: Mapping[str, int]) -> dict[str, dict[str, float]]:
        """Per role with workers: tokens/s and idle fraction since the last call; then reset."""
        span = max(now - self._since, 1e-9)
        rates = {}
        for role, count in sorted(workers.items()):
            if count <= 0:
                continue
            busy = min(self._busy[role] / (span * count), 1.0)
            rates[role] = {
                "tokens_per_s": round(self._tokens[role] / span, 1),
                "idle_frac": round(1.0 - busy, 3),
            }
        self._since = now
        self._busy.clear()
        self._tokens.clear()
        return rates
