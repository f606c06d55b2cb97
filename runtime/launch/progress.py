"""A progress line for long runs, read from ``metrics.jsonl`` (the run's one record of steps).

Reading the file rather than the bus keeps the launcher free of sockets and shows the same
numbers a user finds afterwards. On a terminal the line is redrawn in place; otherwise one
line is printed every ``every_s`` seconds at most.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

__all__ = ["ProgressReporter", "progress_line"]


def progress_line(
    last: dict[str, Any], total_steps: int, elapsed_s: float, eta_s: float | None = None
) -> str:
    """``[####------] step 12/200 · 3.1 steps/s · reward 0.41 · val 0.62 (v10) · 40s ·
    ETA 1m01s`` (the ETA once a step has come since the first one seen)."""
    step = int(last.get("step", 0))
    done = min(_BAR, _BAR * step // max(total_steps, 1))
    parts = [f"[{'#' * done}{'-' * (_BAR - done)}] step {step}/{total_steps}"]
    if elapsed_s > 0 and step:
        parts.append(f"{step / elapsed_s:.2f} steps/s")
    for key, label in _SHOWN:
        value = last.get(key)
        if isinstance(value, int | float):
            parts.append(f"{label} {value:.3g}")
    if isinstance(last.get("val_reward"), int | float):
        parts.append(f"val {last['val_reward']:.3g} (v{last.get('val_version', '?')})")
    parts.append(f"{elapsed_s:.0f}s")
    if eta_s is not None and step < total_steps:
        parts.append(f"ETA {_duration(eta_s)}")
    return " · ".join(parts)


def _duration(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s" if m else f"{s}s"


def estimate_eta(first: tuple[int, float], now: tuple[int, float], total: int) -> float | None:
    """Seconds left at the pace since ``first`` (step, time) was seen: not since the
    start, which includes loading models, nor one step's time, which is noisy."""
    steps, seconds = now[0] - first[0], now[1] - first[1]
    if steps <= 0 or seconds <= 0:
        return None
    return (total - now[0]) * seconds / steps


_BAR = 20
# What a step's metrics line may hold, and the label shown for it (demo runs hold fewer).
_SHOWN = (("reward_mean", "reward"), ("staleness_mean", "staleness"))


class ProgressReporter:
    def __init__(
        self, metrics: Path, total_steps: int, *, every_s: float = 1.0, out: TextIO | None = None
    ) -> None:
        self.metrics = metrics
        self.total_steps = total_steps
        self.every_s = every_s
        self.out = out or sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._started = time.monotonic()
        self._shown = ""
        self._first: tuple[int, float] | None = None  # the first step seen, and when

    def __enter__(self) -> ProgressReporter:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._show(final=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._show(final=False)

    def _show(self, *, final: bool) -> None:
        last = _last_line(self.metrics)
        if last is None:
            return
        now = time.monotonic()
        step = int(last.get("step", 0))
        if self._first is None:
            self._first = (step, now)
        eta = estimate_eta(self._first, (step, now), self.total_steps)
        line = progress_line(last, self.total_steps, now - self._started, eta)
        tty = self.out.isatty()
        if line.split(" · ")[0] == self._shown.split(" · ")[0] and not (tty or final):
            return  # no new step: don't repeat the line in a log
        self._shown = line
        if tty:
            self.out.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()


def _last_line(path: Path) -> dict[str, Any] | None:
    """The last whole JSON line of ``path`` (reads only its tail)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    for line in reversed(tail.splitlines(keepends=True)):
        if line.endswith("\n"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None
