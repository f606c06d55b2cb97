"""A child's failures to start, counted while they repeat the same way: a crash loop.

A failed exit is a failure to start unless the child came up first: it said ``up``
(child_status.py), or, saying nothing about its start, it lived ``healthy_after_s``. One that
said ``starting`` and never ``up`` did not come up, however long it took: a large model can
load for minutes before the error that will recur on every start. One that came up and then
failed in its own words before its first piece of work (it never said ``working``) counts
too: a training group whose first update breaks comes up every time and fails there every
time. The count goes on while the reason stays the same and starts over at anything else:
another reason, or a child that failed after it did some work or without a word (an
occasional crash, ``kill -9`` of a running worker), which is restarted as ever.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.runtime.contract.child_status import ChildStatus

__all__ = ["StartFailures"]


@dataclass(slots=True)
class StartFailures:
    limit: int  # this many in a row with one reason is a crash loop; 0: never give up
    healthy_after_s: float  # a child that says nothing came up if it lived this long
    reason: str | None = None  # the reason of the failures counted so far
    count: int = 0

    def record(self, status: ChildStatus, lived_s: float, reason: str) -> bool:
        """Note a failed exit and its ``reason``; True once it is a crash loop."""
        silent_but_lived = not status.starting and lived_s >= self.healthy_after_s
        if status.started_well or silent_but_lived:
            self.reason, self.count = None, 0  # a crash, not a failure to start
            return False
        self.count = self.count + 1 if reason == self.reason else 1
        self.reason = reason
        return 0 < self.limit <= self.count
