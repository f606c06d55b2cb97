"""Rollout dumps (``run.dump_rollouts``): the files, how a line is appended, how they are read.

Every sample the trainer trained, and every sample of a group the reward role filtered
out, is one JSON line under ``<run dir>/rollouts/`` (:attr:`RunDir.rollouts`):

- ``steps-0000001-0000100.jsonl`` ...: the trainer's lines, one file per
  :data:`STEPS_PER_FILE` steps, so a long run can be browsed a step range at a time.
  Only the trainer writes them (rank 0 of a sharded one), one process at a time.
- ``filtered-<writer>.jsonl``: each writing process (a reward worker) has its own file,
  named after the worker and its process id, so no two processes append to one file.

A line is written with one ``write`` call and nothing is buffered in the process, so a
``kill -9`` leaves every line whole except at most the last one, which may be torn. A
writer that opens a file whose last line is torn ends it with a newline first; readers
skip every line that is not a whole JSON object (and count them). Nothing is fsynced: a
line survives the death of its process, not of its host's power.

A step trained again after the run rolled back, or after a trainer restart, writes its
lines again. Which lines stand: each trainer line carries ``trainer_start`` (when the
trainer process that wrote it started, ns) and ``resumed_at`` (the step that process took
up). A line of step ``s`` is superseded when a trainer that started later resumed at a
step before ``s``: the steps after that point were trained again, or will be, from other
data. What is left has one line per (step, gid, row); should two remain, the later
trainer's stands. Filtered lines are kept per gid, the newest (``time``) standing.
"""

from __future__ import annotations

import errno
import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "STEPS_PER_FILE",
    "RolloutDumps",
    "append_lines",
    "filtered_file",
    "read_rollouts",
    "steps_file",
]

FORMAT_VERSION = 1  # the "v" of every line; a reader takes the versions it knows
STEPS_PER_FILE = 100

_STEPS_PREFIX = "steps-"
_FILTERED_PREFIX = "filtered-"


def steps_file(directory: Path, step: int) -> Path:
    """The file of ``directory`` that holds train step ``step``'s lines (steps count from 1)."""
    if step < 1:
        raise ValueError(f"train steps count from 1, got step {step}")
    first = (step - 1) // STEPS_PER_FILE * STEPS_PER_FILE + 1
    return directory / f"{_STEPS_PREFIX}{first:07d}-{first + STEPS_PER_FILE - 1:07d}.jsonl"


def filtered_file(directory: Path, writer: str) -> Path:
    """The file of ``directory`` that the process named ``writer`` appends its filtered
    samples to: its own, since the name carries the process id."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in writer) or "worker"
    return directory / f"{_FILTERED_PREFIX}{safe}-{os.getpid()}.jsonl"


def append_lines(path: Path, lines: Iterable[Mapping[str, Any]]) -> int:
    """Append ``lines`` to ``path`` as JSON lines in one write, made private (0600, the
    directory 0700) if new; returns the bytes written. A torn last line left by an
    earlier process is ended first, so the new lines stay whole."""
    data = "".join(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n" for line in lines)
    if not data:
        return 0
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = "\n" + data
        payload = memoryview(data.encode("utf-8"))
        while payload:
            try:
                payload = payload[os.write(fd, payload) :]
            except InterruptedError:
                continue
            except OSError as error:
                if error.errno == errno.EINTR:
                    continue
                raise
    finally:
        os.close(fd)
    return len(data.encode("utf-8"))


@dataclass(slots=True)
class RolloutDumps:
    """What a run's dumps hold, once superseded and repeated lines are left out."""

    trained: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # step -> lines
    filtered: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # lines that were not a whole JSON object (torn) or of another version
    superseded: int = 0  # trainer lines of steps trained again after a rollback or restart

    def samples(self) -> Iterator[dict[str, Any]]:
        """Every trained line, by step."""
        for step in sorted(self.trained):
            yield from self.trained[step]


def read_rollouts(directory: Path) -> RolloutDumps:
    """The dumps in ``directory`` (a run's ``rollouts/``); empty if there is none."""
    out = RolloutDumps()
    if not directory.is_dir():
        return out
    trainer: list[dict[str, Any]] = []
    for path in sorted(directory.glob(f"{_STEPS_PREFIX}*.jsonl")):
        out.skipped += _read(path, trainer, "trained")
    filtered: list[dict[str, Any]] = []
    for path in sorted(directory.glob(f"{_FILTERED_PREFIX}*.jsonl")):
        out.skipped += _read(path, filtered, "filtered")
    out.trained, out.superseded = _standing(trainer)
    newest: dict[Any, dict[str, Any]] = {}
    for line in filtered:
        key = (line.get("gid"), line.get("row"))
        if key not in newest or line.get("time", 0) >= newest[key].get("time", 0):
            newest[key] = line
    out.filtered = sorted(newest.values(), key=lambda line: (line.get("time", 0), *_at(line)))
    return out


def _read(path: Path, into: list[dict[str, Any]], kind: str) -> int:
    """Append ``path``'s lines of ``kind`` to ``into``; the count of lines skipped."""
    skipped = 0
    with path.open("rb") as file:
        for raw in file:
            try:
                line = json.loads(raw)
            except (ValueError, UnicodeDecodeError):  # torn by a kill as it was written
                skipped += raw.strip() != b""
                continue
            if not isinstance(line, dict) or line.get("v") != FORMAT_VERSION:
                skipped += 1
            elif line.get("kind") == kind:
                into.append(line)
    return skipped


def _at(line: Mapping[str, Any]) -> tuple[int, int]:
    gid, row = line.get("gid"), line.get("row")
    return (gid if isinstance(gid, int) else -1, row if isinstance(row, int) else -1)


def _standing(lines: list[dict[str, Any]]) -> tuple[dict[int, list[dict[str, Any]]], int]:
    """The trainer lines that stand (see the module), by step; and how many did not."""
    starts: dict[int, int] = {}  # trainer start -> the step it resumed at
    for line in lines:
        start, resumed = line.get("trainer_start"), line.get("resumed_at")
        if isinstance(start, int) and isinstance(resumed, int):
            starts[start] = min(resumed, starts.get(start, resumed))
    by_start = sorted(starts.items())
    # For each start, the earliest step a later start resumed at: its lines past it fell.
    cut: dict[int, float] = {}
    lowest = float("inf")
    for start, resumed in reversed(by_start):
        cut[start] = lowest
        lowest = min(lowest, resumed)
    kept: dict[tuple[int, int, int], dict[str, Any]] = {}
    superseded = 0
    for line in lines:
        step = line.get("step")
        if not isinstance(step, int):
            continue
        start = line.get("trainer_start")
        if step > (cut.get(start, float("inf")) if isinstance(start, int) else float("inf")):
            superseded += 1
            continue
        key = (step, *_at(line))
        if key in kept:
            superseded += 1
            if kept[key].get("trainer_start", 0) > line.get("trainer_start", 0):
                continue
        kept[key] = line
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (step, _, _), line in sorted(kept.items()):
        by_step[step].append(line)
    return dict(by_step), superseded
