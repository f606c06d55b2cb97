"""Where one worker's main thread spends its wall time, split into disjoint buckets.

The worker wraps each kind of wait or work in :meth:`TimeSplit.spent_on`; time outside
any span is ``OTHER`` (the loop's own bookkeeping). Spans nest, and the innermost one is
charged: a WantWeights round trip made while loading a version is scheduler time, not
weights time. :meth:`TimeSplit.take` hands over what was spent since the previous take
(each completion carries it), so the buckets of a worker's reports add up to its wall
time from the first take on.

Only the thread that called :meth:`TimeSplit.start` is measured: the link's late-reply
thread and the heartbeat thread use the same request path, and their time is not the
loop's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from asyncrl.runtime.contract.bus import TimeBucket

__all__ = ["TimeSplit"]

_BUCKETS = len(TimeBucket)


class _Span:
    """One ``spent_on`` block: its own time (not its inner spans') goes to ``bucket``."""

    __slots__ = ("_counted", "_split", "bucket", "own")

    def __init__(self, split: TimeSplit, bucket: TimeBucket) -> None:
        self._split = split
        self.bucket = bucket
        self.own = 0.0
        self._counted = False

    def charge_to(self, bucket: TimeBucket) -> None:
        """Count this span's time as ``bucket`` instead (decided once its end is known)."""
        self.bucket = bucket

    def __enter__(self) -> _Span:
        self._counted = self._split._push(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._counted:
            self._split._pop()


class TimeSplit:
    """Seconds per :class:`TimeBucket` since the last :meth:`take`, for one thread."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._owner: int | None = None
        self._spent = [0.0] * _BUCKETS
        self._open: list[_Span] = []
        self._since = 0.0

    def start(self) -> None:
        """Measure the calling thread from now on (what came before is not counted)."""
        self._owner = threading.get_ident()
        self._spent = [0.0] * _BUCKETS
        self._open = [_Span(self, TimeBucket.OTHER)]
        self._since = self._clock()

    def spent_on(self, bucket: TimeBucket) -> _Span:
        """A context manager: the time inside it (less inner spans') is ``bucket``'s."""
        return _Span(self, bucket)

    def take(self) -> list[float]:
        """Seconds per bucket (indexed by TimeBucket) since the previous take; restarts."""
        if self._owner != threading.get_ident():
            return [0.0] * _BUCKETS
        self._charge()
        for span in self._open:  # spans still running: what they spent so far counts now
            self._spent[span.bucket] += span.own
            span.own = 0.0
        spent, self._spent = self._spent, [0.0] * _BUCKETS
        return spent

    def _charge(self) -> None:
        now = self._clock()
        self._open[-1].own += now - self._since
        self._since = now

    def _push(self, span: _Span) -> bool:
        if self._owner != threading.get_ident():
            return False
        self._charge()
        self._open.append(span)
        return True

    def _pop(self) -> None:
        self._charge()
        span = self._open.pop()
        self._spent[span.bucket] += span.own
