"""``metrics.jsonl``: one JSON line per train step, exactly once across scheduler crashes.

A line is written (handed to the OS) when the step's completion is applied, before the
journal has it; so after a crash the file may be *ahead* of the journal, never behind.
``reconcile`` on start cuts the lines of steps the journal does not hold (they will be
trained again) and a torn last line, so every step appears once.

Each line also goes to the sinks of ``logging.backends`` (sinks.py). A sink that fails is
logged and dropped: a logger's fault must not stop training.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from .sinks import MetricsSink, flatten

__all__ = ["MetricsLog"]

log = structlog.get_logger("asyncrl.scheduler")


class MetricsLog:
    def __init__(self, path: Path, sinks: Sequence[MetricsSink] = ()) -> None:
        self.path = path
        self.sinks = list(sinks)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives with the service

    def reconcile(self, steps_done: int) -> int:
        """Keep only whole lines of steps ``<= steps_done``; returns how many were cut."""
        self._file.flush()
        kept: list[str] = []
        cut = 0
        with open(self.path, encoding="utf-8") as lines:
            for line in lines:
                step = _step_of(line)
                if step is not None and step <= steps_done:
                    kept.append(line)
                else:
                    cut += 1
        if cut:
            tmp = self.path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)
            self._file.close()
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        return cut

    def append(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line, separators=(",", ":"), default=plain) + "\n")
        self._file.flush()
        if self.sinks:
            scalars = dict(flatten(line))
            for sink in list(self.sinks):
                try:
                    sink.step(line["step"], scalars)
                except Exception:
                    log.exception("metrics backend failed; no more lines go to it",
                                  backend=type(sink).__name__)  # fmt: skip
                    self.sinks.remove(sink)

    def close(self) -> None:
        self._file.close()
        for sink in self.sinks:
            sink.close()


def _step_of(line: str) -> int | None:
    if not line.endswith("\n"):
        return None  # torn by a crash mid-write
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if type(step) is int else None


def plain(value: Any) -> Any:
    """Numbers from numpy arrays in a trainer's metrics become plain JSON."""
    tolist = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    raise TypeError(f"metrics value of type {type(value).__name__} is not JSON")
