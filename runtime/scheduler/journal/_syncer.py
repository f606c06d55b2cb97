"""Who writes and fsyncs a writer's batches: its own thread, or that and a log thread.

Both syncers take the same calls from :class:`JournalWriter`: ``request(fd, seq, data,
fsync_within)`` with a batch of framed records ending at ``seq``, to be written to ``fd``
and fsynced (the background syncer may wait up to ``fsync_within`` seconds for the fsync,
so that batches written meanwhile share it),
``run(job)`` for other disk work that must follow everything asked for before it (storing a
snapshot, retiring a segment), and ``barrier()`` when the writer needs everything on disk
before going on (flush, close).

The background syncer writes on the caller's thread and fsyncs on the log thread. A reply
held until its records are written (the scheduler's ``ack_after: write``) then goes out in
the same turn of the loop: handing the write to another thread and waiting to hear back
cost two thread wake-ups per batch, and a write queued behind the previous batch's fsync
waited for that whole fsync (10-100 ms on a busy disk). A ``write`` of a small batch to the
page cache does not wait for an fsync running on the same file (measured on this kind of
ext4 disk while another process fsynced hundreds of MiB: p99 ~40 µs, max 0.2 ms).

Ordering (see the package doc): the log thread does its jobs in the order they were asked
for, and a batch is written on the caller's thread only while no write or other job waits
there; otherwise it queues behind them and the log thread writes it. So a snapshot's job,
which closes the old segment after its last batch was written and fsynced, is never
overtaken by a batch for the new segment, and no record reaches a segment before the
previous segment is fully on disk. ``durable_seq`` only moves to the seq of a batch whose
write had returned before its fsync began.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ._files import write_all


class InlineSyncer:
    """Writes and fsyncs on the caller's thread as soon as asked: deterministic, slower."""

    error: Exception | None = None  # never set: an inline fsync raises at its caller

    def __init__(self, durable_seq: int) -> None:
        self._durable_seq = self._written_seq = durable_seq
        self._fsyncs = 0
        self._fsync_seconds = 0.0

    def request(self, fd: int, seq: int, data: bytearray, fsync_within: float = 0.0) -> None:
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


@dataclass(eq=False, slots=True)
class _Fsync:
    """Records up to ``seq`` were written to ``fd``; make them durable by ``due``."""

    fd: int
    seq: int
    due: float  # time.monotonic()


@dataclass(eq=False, slots=True)
class _Write:
    """Records up to ``seq`` that had to wait for earlier jobs: write them, then fsync."""

    fd: int
    seq: int
    data: bytearray
    written: bool = False


@dataclass(eq=False, slots=True)
class _Run:
    job: Callable[[], None]


_Job = _Fsync | _Write | _Run


class BackgroundSyncer(InlineSyncer):
    """Writes on the caller's thread, fsyncs on a daemon thread (see the module doc).

    A batch asked for while the previous fsync of its fd still waits joins that fsync, and
    a batch that must wait behind other jobs joins the write waiting before it, so a slow
    disk makes fsyncs bigger rather than queueing them. ``fsync_within`` lets the thread
    wait that long before an fsync, for batches written meanwhile to share it; a barrier,
    a later job or a batch due sooner ends the wait. After a failure nothing more is
    done: on Linux a failed fsync may drop the dirty pages, so a later one could succeed
    without the data being on disk. The error is kept in ``error`` and raised by the
    writer's thread; a write that fails on the caller's thread raises there, and is kept too.
    """

    def __init__(
        self, durable_seq: int, name: str, on_progress: Callable[[], None] | None = None
    ) -> None:
        super().__init__(durable_seq)
        self._on_progress = on_progress
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[_Job] = deque()
        self._ordered = 0  # _Write and _Run jobs not done yet: later batches queue behind them
        self._busy = False  # the thread is doing a job
        self._hurry = False  # barrier(): fsync now, whatever was due later
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self, fd: int, seq: int, data: bytearray, fsync_within: float = 0.0) -> None:
        with self._cond:
            if self.error is not None:
                raise self.error
            if self._ordered:
                last = self._jobs[-1] if self._jobs else None
                if isinstance(last, _Write) and last.fd == fd:
                    last.seq = seq
                    last.data += data
                else:
                    self._jobs.append(_Write(fd, seq, data))
                    self._ordered += 1
                self._cond.notify()
                return
        # Only this thread adds jobs, so nothing can be queued between the check and here.
        try:
            write_all(fd, data)
        except Exception as exc:
            with self._cond:
                self.error = exc
            raise
        due = time.monotonic() + fsync_within
        with self._cond:
            self._written_seq = seq
            last = self._jobs[-1] if self._jobs else None
            if isinstance(last, _Fsync) and last.fd == fd:
                last.seq = seq  # not started yet (started jobs leave the queue): covers this
                if due >= last.due:
                    return  # the thread already waits for an earlier time: no need to wake it
                last.due = due
            else:
                self._jobs.append(_Fsync(fd, seq, due))
            self._cond.notify()

    def run(self, job: Callable[[], None]) -> None:
        """Do ``job`` on the thread once everything asked for before it is done."""
        with self._cond:
            self._jobs.append(_Run(job))
            self._ordered += 1
            self._cond.notify()

    def barrier(self) -> None:
        """Wait until every job is done; then raise the error if there was one."""
        with self._cond:
            self._hurry = True
            self._cond.notify()
            while self._jobs or self._busy:
                self._cond.wait()
            self._hurry = False
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
                while not self._ready():
                    self._cond.wait(self._wait_s())
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                if self.error is not None:
                    if not isinstance(job, _Fsync):
                        self._ordered -= 1
                    self._cond.notify_all()  # dropped: wake barrier() so it raises the error
                    continue
                self._busy = True
            self._do(job)

    def _ready(self) -> bool:
        """A job to do now, or nothing left to do and the syncer is stopping."""
        if not self._jobs:
            return self._stopping
        head = self._jobs[0]
        if not isinstance(head, _Fsync) or len(self._jobs) > 1:
            return True  # a later job waits behind it: nothing more can join it
        return self._hurry or self._stopping or head.due <= time.monotonic()

    def _wait_s(self) -> float | None:
        head = self._jobs[0] if self._jobs else None
        return max(0.0, head.due - time.monotonic()) if isinstance(head, _Fsync) else None

    def _do(self, job: _Job) -> None:
        error: Exception | None = None
        elapsed = 0.0
        try:
            if isinstance(job, _Run):
                job.job()
            else:
                if isinstance(job, _Write):
                    write_all(job.fd, job.data)
                    self._written(job)
                start = time.perf_counter()
                os.fsync(job.fd)
                elapsed = time.perf_counter() - start
        except Exception as exc:  # not just OSError: the thread must not die with _busy set
            error = exc
        with self._cond:
            self._busy = False
            if isinstance(job, _Run) or (isinstance(job, _Write) and not job.written):
                self._ordered -= 1
            if error is not None:
                self.error = error
            elif not isinstance(job, _Run):
                self._fsyncs += 1
                self._fsync_seconds += elapsed
                self._durable_seq = job.seq
            self._cond.notify_all()
        self._progressed()

    def _written(self, job: _Write) -> None:
        """A queued batch reached the OS: replies held on it may go, later batches need not
        queue any more."""
        with self._cond:
            self._written_seq = job.seq
            job.written = True
            job.data = bytearray()  # not needed for the fsync
            self._ordered -= 1
        self._progressed()

    def _progressed(self) -> None:
        if self._on_progress is not None:
            self._on_progress()
