"""Calling plug-in code with a time limit, from a thread that may be left behind.

A reward function that hangs (a verifier lost in a huge expression, a reward model on a
slow device) must fail its group, not the worker. Python cannot stop a thread, so each
call runs on a helper thread and the caller waits for it at most ``timeout_s``; a call
past that is left to finish on its own (the thread is a daemon: it never holds up the
process's exit) and later calls get a fresh thread. ``stuck`` counts the left-behind
calls still running, for the caller to decide when a fresh process is due.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Deadline", "DeadlineExceeded"]


class DeadlineExceeded(TimeoutError):
    """The call was still running when its time was up."""


class Deadline:
    """Run calls one at a time, each for at most ``timeout_s`` (None or 0: no limit,
    on the caller's own thread)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s or None
        self._helper: _Helper | None = None
        self._left_behind: list[_Helper] = []

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        if self.timeout_s is None:
            return function(*args)
        if self._helper is None:
            self._helper = _Helper()
        done = self._helper.submit(function, args)
        if not done.wait(self.timeout_s):
            self._helper.retire()
            self._left_behind.append(self._helper)
            self._helper = None
            raise DeadlineExceeded(f"still running after {self.timeout_s:g} s")
        return done.result()

    @property
    def stuck(self) -> int:
        """Calls that timed out and are still running."""
        self._left_behind = [h for h in self._left_behind if h.thread.is_alive()]
        return len(self._left_behind)


class _Outcome:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def wait(self, timeout_s: float) -> bool:
        return self.event.wait(timeout_s)

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class _Helper:
    """One daemon thread taking calls from its own queue until it is retired."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple, _Outcome] | None] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._run, name="plug-in call", daemon=True)
        self.thread.start()

    def submit(self, function: Callable[..., Any], args: tuple) -> _Outcome:
        outcome = _Outcome()
        self.calls.put((function, args, outcome))
        return outcome

    def retire(self) -> None:
        self.calls.put(None)  # taken once the stuck call returns, if it ever does

    def _run(self) -> None:
        while (call := self.calls.get()) is not None:
            function, args, outcome = call
            try:
                outcome.value = function(*args)
            except BaseException as error:  # handed to the caller, who decides
                outcome.error = error
            outcome.event.set()
