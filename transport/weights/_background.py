"""One long-lived thread per receiver that runs its fetches and checks, one at a time.

A receiver's ``want`` is called from the decode loop. Starting a thread there per
version held that loop for 4 ms (median) and up to 12 ms while the trainer kept the
other core busy: ``Thread.start`` returns only once the new thread has been scheduled.
Handing a job to a thread that is already waiting costs a queue put. Jobs run in the
order given, so a newer version's job starts only after the older one has ended.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["Ahead", "JobThread"]

log = structlog.get_logger("asyncrl.weights")

_STOP = object()


class JobThread:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(
        self,
        job: Callable[..., None],
        *args: Any,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        """Run ``job(*args)`` on the thread once the jobs before it have ended; should it
        raise, ``on_error(exception)`` lets the owner record that it ended."""
        self._jobs.put((job, args, on_error))

    def close(self, timeout: float | None) -> None:
        """Let the queued jobs end (up to ``timeout`` seconds; None: however long they
        take), then end the thread."""
        self._jobs.put(_STOP)
        self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not _STOP:
            job, args, on_error = item
            try:
                job(*args)
            except Exception as error:
                # A job that raises is a bug; the jobs after it must still run, and its
                # owner must not wait for it forever (a receiver would never fetch again).
                log.exception("weight-plane job failed", job=getattr(job, "__name__", "?"))
                if on_error is not None:
                    on_error(error)


class Ahead:
    """Work started in the background ahead of a call that must find it done (a
    publisher's buffers, made before its first publish)."""

    def __init__(self) -> None:
        self._thread: JobThread | None = None

    def start(self, name: str, job: Callable[..., None], *args: Any) -> None:
        self.wait()
        self._thread = JobThread(name)
        self._thread.submit(job, *args)

    def wait(self) -> None:
        """Return once the work started (if any) has ended."""
        if self._thread is not None:
            self._thread.close(timeout=None)
            self._thread = None
