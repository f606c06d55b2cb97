"""Restart delays for one child: doubling up to a ceiling, back to the start once it was
healthy (it lived long enough, or it came up: a crash after a good start is no loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Backoff"]


@dataclass(slots=True)
class Backoff:
    initial_s: float
    max_s: float
    healthy_after_s: float
    _next_s: float = field(init=False)

    def __post_init__(self) -> None:
        self._next_s = self.initial_s

    def came_up(self) -> None:
        """The child came up (said so, child_status.py) before it failed: start over."""
        self._next_s = self.initial_s

    def delay_after(self, lived_s: float) -> float:
        """The wait before restarting a child that exited after running `lived_s` seconds."""
        if lived_s >= self.healthy_after_s:
            self._next_s = self.initial_s
        delay = self._next_s
        self._next_s = min(delay * 2, self.max_s)
        return delay
