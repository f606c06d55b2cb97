"""Requests between the API's thread and the generator's decode loop.

The HTTP side (uvicorn's event loop, on its own thread) submits token ids and gets a
future; the generator's main thread takes what was submitted into its decoder between
two decode steps, beside the sequences of its leases, and resolves each future as its
sequence finishes. Only the main thread touches the model: a slow client never holds a
decode step, and weights still load between steps. A request whose future is cancelled
(its HTTP handler was) leaves the decoder at the next step.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, replace

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
        self._cancelled: list[ServeTag] = []

    # --- the API's side (any thread) ----------------------------------------------------

    def submit(
        self,
        prompt: list[int],
        max_new_tokens: int | None,
        stop_ids: frozenset[int],
        stop_when: Callable[[list[int]], bool] | None = None,
        *,
        greedy: bool = False,
        seed: int | None = None,
    ) -> Future[Finished]:
        request = Request(
            None,
            tuple(prompt),
            max_new_tokens=max_new_tokens,
            stop_ids=stop_ids,
            stop_when=stop_when,
            greedy=greedy,
            seed=seed,
        )
        return self.submit_all([request])[0]

    def submit_all(self, requests: Sequence[Request]) -> list[Future[Finished]]:
        """``requests`` (their tags replaced by the bridge's own), taken into the decoder
        at one step: the choices of one call start together."""
        futures: list[Future[Finished]] = []
        with self._lock:
            for request in requests:
                tag = ServeTag(next(self._numbers))
                self._queued.append(replace(request, tag=tag))
                self._futures[tag] = future = Future()
                futures.append(future)
                future.add_done_callback(self._forget_if_cancelled(tag))
        return futures

    def _forget_if_cancelled(self, tag: ServeTag) -> Callable[[Future[Finished]], None]:
        return lambda done: self._forget(tag) if done.cancelled() else None

    def _forget(self, tag: ServeTag) -> None:
        with self._lock:
            if self._futures.pop(tag, None) is not None:
                self._cancelled.append(tag)

    # --- the decode loop's side (the generator's main thread) ---------------------------

    def take(self) -> tuple[list[Request], list[ServeTag]]:
        """What was submitted since the last call, for the decoder, and the tags of the
        requests cancelled meanwhile (to drop from it)."""
        with self._lock:
            taken, self._queued = self._queued, []
            cancelled, self._cancelled = self._cancelled, []
        gone = set(cancelled)
        return [r for r in taken if r.tag not in gone], cancelled

    def finish(self, finished: Finished) -> None:
        with self._lock:
            future = self._futures.pop(finished.tag, None)
        if future is not None:
            with contextlib.suppress(InvalidStateError):  # cancelled this very moment
                future.set_result(finished)

    def fail_all(self, reason: str) -> None:
        """Every request queued or decoding fails (the decoder was dropped, or is stopping)."""
        with self._lock:
            futures, self._futures, self._queued = self._futures, {}, []
        for future in futures.values():
            with contextlib.suppress(InvalidStateError):
                future.set_exception(RuntimeError(reason))

    @property
    def busy(self) -> bool:
        """A request is queued or decoding."""
        with self._lock:
            return bool(self._futures)
