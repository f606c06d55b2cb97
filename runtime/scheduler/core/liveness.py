"""When each worker was last heard from, and which fell silent: soft state of the core.

A heartbeat costs O(1) (a dict write); ``silent(now)`` costs what it finds, not the
number of workers: a heap holds at most one live entry per worker, its deadline never
later than the real one (last seen + timeout). A popped entry whose worker was heard
from since goes back with the real deadline, so each worker is looked at about once per
timeout, however often it heartbeats.

Not journaled: workers heartbeat again after a restart, and ``resume`` gives them grace.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping

__all__ = ["Liveness"]


class Liveness(Mapping[str, float]):
    """worker -> when it was last seen (a read-only mapping), and who is silent."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._seen: dict[str, float] = {}
        self._deadline: dict[str, float] = {}  # the deadline of each worker's heap entry
        self._heap: list[tuple[float, str]] = []
        # the order workers were first seen in: those silent at once are lost in it
        self._order: dict[str, int] = {}
        self._counter = itertools.count()

    def saw(self, worker: str, now: float) -> None:
        if worker not in self._seen:
            self._order[worker] = next(self._counter)
        self._seen[worker] = now
        deadline = now + self.timeout
        pushed = self._deadline.get(worker)
        if pushed is None or deadline < pushed:  # a clock that went back: look sooner
            self._deadline[worker] = deadline
            heapq.heappush(self._heap, (deadline, worker))

    def forget(self, worker: str) -> None:
        self._seen.pop(worker, None)
        self._deadline.pop(worker, None)  # its heap entry is stale from now on
        self._order.pop(worker, None)

    def silent(self, now: float) -> list[str]:
        """Workers not seen for ``timeout`` by ``now``, in the order they were first seen."""
        found: list[str] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, worker = heapq.heappop(heap)
            if self._deadline.get(worker) != deadline:
                continue  # forgotten, or pushed again since
            real = self._seen[worker] + self.timeout
            if real <= now:
                found.append(worker)
                del self._deadline[worker]  # looked at again once forgotten or seen
            else:
                self._deadline[worker] = real
                heapq.heappush(heap, (real, worker))
        found.sort(key=self._order.__getitem__)
        return found

    def __getitem__(self, worker: str) -> float:
        return self._seen[worker]

    def __iter__(self) -> Iterator[str]:
        return iter(self._seen)

    def __len__(self) -> int:
        return len(self._seen)
