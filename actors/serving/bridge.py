"""Requests between the API's thread and the generator's decode loop.

The HTTP side (uvicorn's event loop, on its own thread) submits token ids and gets a
future; the generator's main thread takes what was submitted into its decoder between
two decode steps, beside the sequences of its leases, and resolves each future as its
sequence finishes. Only the main thread touches the model: a slow client never holds a
decode step, and weights still load between steps.
"""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from ..policy.decoder import Finished, Request

__all__ = ["Bridge", "ServeTag"]


@dataclass(frozen=True, slots=True)
class ServeTag:
    """The decoder tag of a served request."""

    number: int


class Bridge:
    """A thread-safe queue of requests, and the futures their results resolve."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self._queued: list[Request] = []
        self._futures: dict[ServeTag, Future[Finished]] = {}

    # --- the API's side (any thread) ----------------------------------------------------

    def submit(
        self, prompt: list[int], max_new_tokens: int | None, stop_ids: frozenset[int]
    ) -> Future[Finished]:
        future: Future[Finished] = Future()
        with self._lock:
            tag = ServeTag(next(self._numbers))
            request = Request(tag, tuple(prompt), max_new_tokens=max_new_tokens, stop_ids=stop_ids)
            self._queued.append(request)
            self._futures[tag] = future
        return future

    # --- the decode loop's side (the generator's main thread) ---------------------------

    def take(self) -> list[Request]:
        """Everything submitted since the last call, for the decoder."""
        with self._lock:
            taken, self._queued = self._queued, []
        return taken

    def finish(self, finished: Finished) -> None:
        with self._lock:
            future = self._futures.pop(finished.tag, None)
        if future is not None:
            future.set_result(finished)

    def fail_all(self, reason: str) -> None:
        """Every request queued or decoding fails (the decoder was dropped, or is stopping)."""
        with self._lock:
            futures, self._futures, self._queued = self._futures, {}, []
        for future in futures.values():
            future.set_exception(RuntimeError(reason))

    @property
    def busy(self) -> bool:
        """A request is queued or decoding."""
        with self._lock:
            return bool(self._futures)
