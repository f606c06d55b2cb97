"""Who writes and fsyncs a writer's batches: its own thread, or a background log thread.

Both syncers take the same calls from :class:`JournalWriter`: ``request(fd, seq, data)``
with a batch of framed records ending at ``seq``, to be written to ``fd`` and fsynced, and
``barrier()`` when the writer needs everything on disk before going on (flush, snapshot,
segment roll, close). The background one also does the ``write``: on this kind of disk a
write to a file whose pages are under writeback can wait as long as the fsync itself.
"""

from __future__ import annotations

import os
import threading
import time

from ._files import write_all


class InlineSyncer:
    """fsyncs on the caller's thread as soon as asked: the deterministic, slower mode."""

    error: Exception | None = None  # never set: an inline fsync raises at its caller

    def __init__(self, durable_seq: int) -> None:
        self._durable_seq = durable_seq
        self._fsyncs = 0
        self._fsync_seconds = 0.0

    def request(self, fd: int, seq: int, data: bytearray) -> None:
        write_all(fd, data)
        start = time.perf_counter()
        os.fsync(fd)
        self._fsync_seconds += time.perf_counter() - start
        self._fsyncs += 1
        self._durable_seq = seq

    def barrier(self) -> None:
        """Nothing to wait for: every request was synced before it returned."""

    def counters(self) -> tuple[int, float, int]:
        """(fsyncs, seconds spent in them, highest seq fsync'd)."""
        return self._fsyncs, self._fsync_seconds, self._durable_seq

    def close(self) -> None:
        pass


class BackgroundSyncer(InlineSyncer):
    """fsyncs on a daemon thread so that the appending thread never waits for the disk.

    At most one request waits: a newer one for the same fd replaces it, because fsync covers
    everything written before it, so a slow disk makes batches bigger rather than queueing
    them. After a failed fsync it fsyncs nothing more: on Linux a failed fsync may drop the
    dirty pages, so a later one could succeed without the data being on disk. The error is
    kept in ``error`` for the writer's thread to raise.
    """

    def __init__(self, durable_seq: int, name: str) -> None:
        super().__init__(durable_seq)
        self._cond = threading.Condition(threading.Lock())
        self._waiting: tuple[int, int] | None = None  # (fd, seq) not yet taken by the thread
        self._data = bytearray()  # the bytes of the waiting request, in order
        self._busy = False  # the thread is inside os.fsync
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self, fd: int, seq: int, data: bytearray) -> None:
        with self._cond:
            # The writer calls barrier() before it closes or replaces an fd, so a waiting
            # request is always for the fd in use; merging one for another fd would lose it.
            assert self._waiting is None or self._waiting[0] == fd, "fd switched without barrier"
            self._waiting = (fd, seq)
            self._data += data
            self._cond.notify_all()

    def barrier(self) -> None:
        """Wait until every request is done; then raise the fsync error if there was one.

        Once it returns, the thread touches no fd until the next request, so the writer may
        close the segment it was syncing.
        """
        with self._cond:
            while self._waiting is not None or self._busy:
                self._cond.wait()
        if self.error is not None:
            raise self.error

    def counters(self) -> tuple[int, float, int]:
        with self._cond:
            return self._fsyncs, self._fsync_seconds, self._durable_seq

    def close(self) -> None:
        """Finish the requests made so far and stop the thread. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._stopping:
                    self._cond.wait()
                if self._waiting is None:
                    return
                (fd, seq), self._waiting = self._waiting, None
                data, self._data = self._data, bytearray()
                if self.error is not None:
                    self._cond.notify_all()  # dropped: wake barrier() so it raises the error
                    continue
                self._busy = True
            start = time.perf_counter()
            error: Exception | None = None
            try:
                write_all(fd, data)
                os.fsync(fd)
            except Exception as exc:  # not just OSError: the thread must not die with _busy set
                error = exc
            elapsed = time.perf_counter() - start
            with self._cond:
                self._busy = False
                self._fsync_seconds += elapsed
                if error is None:
                    self._fsyncs += 1
                    self._durable_seq = seq
                else:
                    self.error = error
                self._cond.notify_all()
