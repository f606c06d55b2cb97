"""The lease timeline, taken out of a trace: rows of workers, bars of leases, marks.

Pure data, no drawing: the Gantt chart (gantt.py) and the headline figures (the overlap of
generation and training) both read it. Times are seconds from the trace's first event.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Gate

__all__ = ["GENERATE_ROLE", "TRAIN_ROLE", "Bar", "Timeline", "busy_overlap", "timeline_from_trace"]

# Rows in data-flow order; roles of a custom pipeline follow, by name.
_ROLE_ORDER = DEFAULT_PIPELINE.worker_roles
GENERATE_ROLE = DEFAULT_PIPELINE.gated(Gate.ADMIT).role
TRAIN_ROLE = DEFAULT_PIPELINE.gated(Gate.STEP).role


@dataclass(frozen=True, slots=True)
class Bar:
    start: float
    end: float
    outcome: str = "complete"


@dataclass(slots=True)
class Timeline:
    rows: list[tuple[str, str]] = field(default_factory=list)  # (role, worker), top first
    leases: dict[str, list[Bar]] = field(default_factory=dict)  # worker -> its leases
    weights: dict[str, list[Bar]] = field(default_factory=dict)  # worker -> weight loads
    steps: list[tuple[float, int]] = field(default_factory=list)  # (time, step)
    span: float = 0.0  # seconds from the first event to the last

    def role_intervals(self, role: str) -> list[tuple[float, float]]:
        return [(b.start, b.end) for r, w in self.rows if r == role for b in self.leases.get(w, [])]


def timeline_from_trace(events: Iterable[dict[str, Any]]) -> Timeline:
    """Rows, bars and step marks from trace events (see runtime/scheduler/service/trace.py)."""
    events = list(events)
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), int | float)]
    t0 = min((e["ts"] for e in timed), default=0)
    roles: dict[Any, str] = {}
    names: dict[tuple[Any, Any], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            roles[e.get("pid")] = str(e.get("args", {}).get("name"))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name"))
    out = Timeline()
    seen: dict[str, str] = {}  # worker -> role
    end = 0.0
    for e in timed:
        start = (e["ts"] - t0) / 1e6
        stop = start + float(e.get("dur", 0)) / 1e6
        end = max(end, stop)
        if e.get("ph") == "i" and e.get("cat") == "train":
            out.steps.append((start, int(e.get("args", {}).get("step", 0))))
            continue
        if e.get("ph") != "X":
            continue
        key = (e.get("pid"), e.get("tid"))
        worker = names.get(key, f"{key[0]}:{key[1]}")
        seen.setdefault(worker, roles.get(e.get("pid"), str(e.get("name"))))
        if e.get("cat") == "lease":
            outcome = str(e.get("args", {}).get("outcome", "complete"))
            out.leases.setdefault(worker, []).append(Bar(start, stop, outcome))
        elif e.get("cat") == "weights":
            out.weights.setdefault(worker, []).append(Bar(start, stop))
    out.rows = sorted(((role, w) for w, role in seen.items()), key=_row_order)
    out.span = end
    return out


def _row_order(row: tuple[str, str]) -> tuple[int, str, int, str]:
    role, worker = row
    rank = _ROLE_ORDER.index(role) if role in _ROLE_ORDER else len(_ROLE_ORDER)
    prefix, _, index = worker.rpartition("-")
    number = int(index) if index.isdigit() else 0  # generate-10 after generate-9
    return rank, role, number, prefix or worker


def busy_overlap(
    inner: Sequence[tuple[float, float]], outer: Sequence[tuple[float, float]]
) -> float | None:
    """The share of the time covered by ``inner`` intervals during which ``outer`` ones
    are running too (e.g. of training time, the part with a generation going on);
    None when ``inner`` covers no time."""
    a, b = _union(inner), _union(outer)
    total = sum(e - s for s, e in a)
    if total <= 0:
        return None
    both, j = 0.0, 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            both += min(e, b[k][1]) - max(s, b[k][0])
            k += 1
    return both / total


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged
