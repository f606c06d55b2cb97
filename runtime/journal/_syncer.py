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
from collections import deque
from collections.abc import Callable
from typing import Any

from ._files import write_all


class InlineSyncer:
    """fsyncs on the caller's thread as soon as asked: the deterministic, slower mode."""

    error: Exception | None = None  # never set: an inline fsync raises at its caller

    def __init__(self, durable_seq: int) -> None:
        self._durable_seq = self._written_seq = durable_seq
        self._fsyncs = 0
        self._fsync_seconds = 0.0

    def request(self, fd: int, seq: int, data: bytearray) -> None:
        write_all(fd, data)
        self._written_seq = seq
        start = time.perf_counter()
        os.fsync(fd)
        self._fsync_seconds += time.perf_counter() - start
        self._fsyncs += 1
        self._durable_seq = seq

    def run(self, job: Callable[[], None]) -> None:
        job()

    def barrier(self) -> None:
        """Nothing to wait for: every request was synced before it returned."""

    def counters(self) -> tuple[int, float, int]:
        """(fsyncs, seconds spent in them, highest seq fsync'd)."""
        return self._fsyncs, self._fsync_seconds, self._durable_seq

    def written_seq(self) -> int:
        """Highest seq handed to the OS: it survives a crash of this process, not of the host."""
        return self._written_seq

    def close(self) -> None:
        pass


class BackgroundSyncer(InlineSyncer):
    """Writes and fsyncs on a daemon thread so that the appending thread never waits.

    Work runs in the order it was asked for: batches (``request``) and other disk work
    (``run``, e.g. storing a snapshot and retiring a segment). A batch asked for while the
    previous one for the same fd still waits joins it, so a slow disk makes batches bigger
    rather than queueing them. After a failure nothing more is done: on Linux a failed
    fsync may drop the dirty pages, so a later one could succeed without the data being on
    disk. The error is kept in ``error`` for the writer's thread to raise.
    """

    def __init__(
        self, durable_seq: int, name: str, on_progress: Callable[[], None] | None = None
    ) -> None:
        super().__init__(durable_seq)
        self._on_progress = on_progress
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[list[Any]] = deque()  # [fd, seq, data] or [callable]
        self._busy = False  # the thread is doing a job
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self, fd: int, seq: int, data: bytearray) -> None:
        with self._cond:
            last = self._jobs[-1] if self._jobs else None
            if last is not None and len(last) == 3 and last[0] == fd:
                last[1] = seq
                last[2] += data
            else:
                self._jobs.append([fd, seq, data])
            self._cond.notify_all()

    def run(self, job: Callable[[], None]) -> None:
        """Do ``job`` on the thread once everything asked for before it is done."""
        with self._cond:
            self._jobs.append([job])
            self._cond.notify_all()

    def barrier(self) -> None:
        """Wait until every job is done; then raise the error if there was one."""
        with self._cond:
            while self._jobs or self._busy:
                self._cond.wait()
        if self.error is not None:
            raise self.error

    def counters(self) -> tuple[int, float, int]:
        with self._cond:
            return self._fsyncs, self._fsync_seconds, self._durable_seq

    def written_seq(self) -> int:
        with self._cond:
            return self._written_seq

    def close(self) -> None:
        """Finish the jobs asked for so far and stop the thread. Idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                if self.error is not None:
                    self._cond.notify_all()  # dropped: wake barrier() so it raises the error
                    continue
                self._busy = True
            self._do(job)

    def _do(self, job: list[Any]) -> None:
        start = time.perf_counter()
        error: Exception | None = None
        try:
            if len(job) == 3:
                write_all(job[0], job[2])
                with self._cond:
                    self._written_seq = job[1]
                self._progressed()
                os.fsync(job[0])
            else:
                job[0]()
        except Exception as exc:  # not just OSError: the thread must not die with _busy set
            error = exc
        elapsed = time.perf_counter() - start
        with self._cond:
            self._busy = False
            if error is not None:
                self.error = error
            elif len(job) == 3:
                self._fsyncs += 1
                self._fsync_seconds += elapsed
                self._durable_seq = job[1]
            self._cond.notify_all()
        self._progressed()

    def _progressed(self) -> None:
        if self._on_progress is not None:
            self._on_progress()
