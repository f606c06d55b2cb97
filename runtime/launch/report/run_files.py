"""What a report is drawn from: a run directory's files, read once, read-only.

Every file is optional: a run still going has written only part of them, a run from an
earlier version of asyncrl lacks the newer ones (trace.json), a crash may have torn a
last line. Each file that is absent or unreadable becomes a line in ``missing`` saying what
the report cannot show without it, and the rest is drawn. The evaluations of checkpoints
(``asyncrl eval``'s ``eval.jsonl`` under ``<run.dir>/eval/``) are read where there are
any; a run that was never evaluated lacks nothing.

``elapsed_s`` counts from the start of the scheduler that wrote a line, so it starts again
at 0 when a run is resumed. Each line gets ``run_s`` too: the same time with the
scheduler's lifetimes laid end to end (each restart continues from the last step line of
the lifetime before; the time the run was down is left out), which plots use as one axis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.scheduler.service.trace import read_trace

__all__ = ["EVAL_FILE", "RunData", "load_run"]

EVAL_FILE = "eval.jsonl"  # one line per evaluation, in each of its output directories


@dataclass(slots=True)
class RunData:
    run: RunDir
    config_text: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl
    validation: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)  # eval/**/eval.jsonl, by time
    weight_loads: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # what is absent, and what it costs

    @property
    def total_steps(self) -> int | None:
        total = self.config.get("run", {}).get("total_steps")
        return total if isinstance(total, int) else None


def load_run(root: Path) -> RunData:
    """Read every file of the run directory ``root`` that a report uses."""
    run = RunDir(root)
    data = RunData(run)
    if run.config.exists():
        import yaml  # the config is YAML; only its text and a few numbers are used

        data.config_text = run.config.read_text(encoding="utf-8")
        loaded = yaml.safe_load(data.config_text)
        data.config = loaded if isinstance(loaded, dict) else {}
    else:
        data.missing.append(f"{run.config.name}: the run's configuration is not shown")
    data.steps = _jsonl(run.metrics, data.missing, "reward, staleness, throughput plots")
    data.validation = _jsonl(
        run.validation, data.missing, "validation reward, per data source or pass@k"
    )
    data.evals = _evals(run.evaluations)
    data.weight_loads = _jsonl(run.weight_loads, data.missing, "weight transfer and load plot")
    if not run.trace.exists():
        data.missing.append(
            f"{run.trace.name}: no lease timeline (runs before traces were written, or "
            "with logging.trace false)"
        )
    else:
        try:
            data.trace = read_trace(run.trace)
        except ValueError as error:
            data.missing.append(f"{run.trace.name} unreadable ({error}): no lease timeline")
    offsets = _lifetime_offsets(data.steps)
    for lines in (data.steps, data.validation, data.weight_loads):
        _join_lifetimes(lines, offsets)
    return data


def _lifetime_offsets(steps: list[dict[str, Any]]) -> list[float]:
    """Where each scheduler lifetime starts on the joined time axis."""
    offsets, last = [0.0], None
    for line in steps:
        elapsed = line.get("elapsed_s")
        if not isinstance(elapsed, int | float):
            continue
        if last is not None and elapsed < last:
            offsets.append(offsets[-1] + last)
        last = elapsed
    return offsets


def _join_lifetimes(lines: list[dict[str, Any]], offsets: list[float]) -> None:
    """Set ``run_s`` on each line: a drop of ``elapsed_s`` starts the next lifetime."""
    lifetime, last = 0, None
    for line in lines:
        elapsed = line.get("elapsed_s")
        if not isinstance(elapsed, int | float):
            continue
        if last is not None and elapsed < last:
            lifetime = min(lifetime + 1, len(offsets) - 1)
        last = elapsed
        line["run_s"] = offsets[lifetime] + elapsed


def _evals(root: Path) -> list[dict[str, Any]]:
    """Every evaluation line under ``root`` (each ``--out`` of ``asyncrl eval`` given
    inside it has its own ``eval.jsonl``), oldest first; a line that names no checkpoint
    is not an evaluation's and is skipped, as a torn one."""
    if not root.is_dir():
        return []
    lines = [
        line
        for path in sorted(root.rglob(EVAL_FILE))
        if path.is_file()
        for line in _jsonl(path, [], "")
        if isinstance(line.get("checkpoint"), str)
    ]
    # unix times sort them; a line without one keeps its place after those with one
    return sorted(lines, key=lambda x: _time(x.get("time")))


def _time(value: object) -> float:
    return float(value) if isinstance(value, int | float) else float("inf")


def _jsonl(path: Path, missing: list[str], shows: str) -> list[dict[str, Any]]:
    """The whole JSON objects of a JSON-lines file; a torn or foreign line is skipped."""
    if not path.exists():
        missing.append(f"{path.name}: no {shows}")
        return []
    lines = []
    for text in path.read_text(encoding="utf-8").splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines
