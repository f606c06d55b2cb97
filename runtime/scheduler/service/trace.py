"""``trace.json``: the run as Chrome trace events (open it in Perfetto or chrome://tracing).

Written by the scheduler from what it already sees, so no message on the bus is added:

- every lease, from its grant to the moment it left the core (completed, failed, expired,
  or its worker lost), as a complete event (``ph: X``) on its worker's row, named by role;
- each train step as a global instant (``ph: i``, ``s: g``): a line across every row;
- each weight publication (on the trainer's row) and each ``LoadedVersion`` (on the
  loader's row) as an instant, and each generator's weight-load report as a complete event
  of its transfer and load, ending when the report arrived (the worker measured it; the
  scheduler only places it on its own clock).

Rows: one trace process per role, one thread per worker, named by metadata events, and a
``scheduler`` process (pid 0) for the steps.

The file is the JSON array format without its closing bracket, which the format allows so
that a trace survives a crash: ``[`` then one event per line, every line after the first
starting with a comma. A reader appends ``]`` (and drops a torn last line). A resumed
scheduler cuts a torn line and goes on appending; timestamps are microseconds of the wall
clock (``now`` is the service's monotonic time, shifted by an offset taken once at start),
so the lines of several scheduler lifetimes fall in order, and its rows keep the ids the
file gave them (read back from the file's metadata events, once, at start).

Cost is bounded per event, not per run: one JSON encoding (msgspec's: the scheduler writes
an event per lease and per version a worker loads) and a buffered write per lease end or
instant, open leases kept until they end (at most the leases the core holds), rows named
once per worker. The buffer reaches the OS at most every ``flush_s`` (on the
scheduler's tick) and when the file closes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from asyncrl.runtime.scheduler.core.effects import Grant

__all__ = ["NO_TRACE", "Trace", "TraceLog", "read_trace"]

_SCHEDULER_PID = 0
_WEIGHT_TIMES = ("transfer_s", "load_s")
_encode = msgspec.json.Encoder().encode


class Trace:
    """What the service tells the trace; this base records nothing (tracing off)."""

    def granted(self, grant: Grant, worker: str, now: float) -> None:
        """A lease was handed out."""

    def settled(self, lease_id: int, outcome: str, live: Container[int], now: float) -> None:
        """A completion or failure of ``lease_id`` was accepted; ``live``: the core's leases."""

    def sweep(self, live: Container[int], now: float) -> None:
        """Leases no longer ``live`` that no completion or failure ended (the clock did)."""

    def step(self, step: int, worker: str, now: float) -> None:
        """Train step ``step`` is done."""

    def published(self, worker: str, version: int, now: float) -> None:
        """``worker`` announced ``version``."""

    def loaded(self, worker: str, version: int, now: float) -> None:
        """``worker`` runs ``version`` now."""

    def weights_report(self, worker: str, version: int, data: dict[str, Any], now: float) -> None:
        """``worker`` measured its load of ``version`` (transfer_s, load_s, stall_s, bytes)."""

    def tick(self, now: float) -> None:
        """The scheduler's periodic turn."""

    def close(self) -> None:
        pass


NO_TRACE = Trace()


@dataclass(slots=True)
class _Open:
    worker: str
    role: str
    start: float
    groups: int
    version: int | None
    completions: int = 0


class TraceLog(Trace):
    """Trace events appended to ``path`` (see the module docstring)."""

    def __init__(
        self, path: Path, *, now: float, wall_offset_s: float, flush_s: float = 1.0
    ) -> None:
        self.path = path
        self.wall_offset_s = wall_offset_s
        self.flush_s = flush_s
        self.events = 0  # written by this process
        self._open: dict[int, _Open] = {}
        self._pids: dict[str, int] = {}
        self._tids: dict[str, tuple[int, int]] = {}  # worker -> (pid, tid)
        self._flushed_at: float | None = None
        self._file, self._first = _open_for_append(path)
        if self._first:
            self._name_process(_SCHEDULER_PID, "scheduler", now)
        else:  # resumed: rows keep the ids they had, or old events would change rows
            self._restore_rows(read_trace(path))

    # --- the service's calls ---------------------------------------------------------

    def granted(self, grant: Grant, worker: str, now: float) -> None:
        self._open[grant.lease_id] = _Open(
            worker, grant.role, now, len(grant.groups), grant.version
        )

    def settled(self, lease_id: int, outcome: str, live: Container[int], now: float) -> None:
        lease = self._open.get(lease_id)
        if lease is None:
            return
        lease.completions += outcome == "complete"
        if lease_id not in live:  # a completion of part of a lease leaves it open
            self._end(lease_id, outcome, now)

    def sweep(self, live: Container[int], now: float) -> None:
        for lease_id in [lid for lid in self._open if lid not in live]:
            self._end(lease_id, "expired or worker lost", now)

    def step(self, step: int, worker: str, now: float) -> None:
        ts = self._ts(now)
        self._write(
            {
                "name": f"step {step}",
                "cat": "train",
                "ph": "i",
                "s": "g",
                "ts": ts,
                "pid": _SCHEDULER_PID,
                "tid": 0,
                "args": {"step": step, "worker": worker},
            }
        )

    def published(self, worker: str, version: int, now: float) -> None:
        self._instant(worker, None, f"publish v{version}", "weights", now, version=version)

    def loaded(self, worker: str, version: int, now: float) -> None:
        self._instant(worker, None, f"loaded v{version}", "weights", now, version=version)

    def weights_report(self, worker: str, version: int, data: dict[str, Any], now: float) -> None:
        times = [data.get(k) for k in _WEIGHT_TIMES]
        if not all(isinstance(t, int | float) and t >= 0 for t in times):
            return
        seconds = float(sum(times))  # type: ignore[arg-type]
        pid, tid = self._row(worker, None, now)
        args = {k: data[k] for k in (*_WEIGHT_TIMES, "stall_s", "bytes", "source") if k in data}
        self._write(
            {
                "name": f"weights v{version}",
                "cat": "weights",
                "ph": "X",
                "ts": self._ts(now - seconds),
                "dur": round(seconds * 1e6, 1),
                "pid": pid,
                "tid": tid,
                "args": {"version": version, **args},
            }
        )

    def tick(self, now: float) -> None:
        if self._flushed_at is None or now - self._flushed_at >= self.flush_s:
            self._file.flush()
            self._flushed_at = now

    def close(self) -> None:
        self._file.close()

    # --- events ----------------------------------------------------------------------

    def _end(self, lease_id: int, outcome: str, now: float) -> None:
        lease = self._open.pop(lease_id)
        pid, tid = self._row(lease.worker, lease.role, lease.start)
        args: dict[str, Any] = {"lease": lease_id, "groups": lease.groups, "outcome": outcome}
        if lease.version is not None:
            args["version"] = lease.version
        self._write(
            {
                "name": lease.role,
                "cat": "lease",
                "ph": "X",
                "ts": self._ts(lease.start),
                "dur": round(max(0.0, now - lease.start) * 1e6, 1),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )

    def _instant(
        self, worker: str, role: str | None, name: str, cat: str, now: float, **args: Any
    ) -> None:
        pid, tid = self._row(worker, role, now)
        self._write(
            {
                "name": name,
                "cat": cat,
                "ph": "i",
                "s": "t",
                "ts": self._ts(now),
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )

    def _row(self, worker: str, role: str | None, now: float) -> tuple[int, int]:
        """The worker's (pid, tid); a new worker's row is named on first sight. A worker's
        role is its name's prefix when no lease told it (a report may come first)."""
        row = self._tids.get(worker)
        if row is not None:
            return row
        role = role or worker.rsplit("-", 1)[0]
        pid = self._pids.get(role)
        if pid is None:
            pid = self._pids[role] = len(self._pids) + 1
            self._name_process(pid, role, now)
        row = self._tids[worker] = (pid, len(self._tids) + 1)
        self._write(
            {
                "name": "thread_name",
                "ph": "M",
                "ts": self._ts(now),
                "pid": pid,
                "tid": row[1],
                "args": {"name": worker},
            }
        )
        return row

    def _restore_rows(self, events: list[dict[str, Any]]) -> None:
        names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
        self._pids = {role: pid for pid, role in names.items() if pid != _SCHEDULER_PID}
        for e in events:
            if e.get("name") == "thread_name":
                self._tids[e["args"]["name"]] = (e["pid"], e["tid"])

    def _name_process(self, pid: int, name: str, now: float) -> None:
        ts = self._ts(now)
        self._write(
            {
                "name": "process_name",
                "ph": "M",
                "ts": ts,
                "pid": pid,
                "tid": 0,
                "args": {"name": name},
            }
        )
        self._write(
            {
                "name": "process_sort_index",
                "ph": "M",
                "ts": ts,
                "pid": pid,
                "tid": 0,
                "args": {"sort_index": pid},
            }
        )

    def _ts(self, now: float) -> int:
        return round((now + self.wall_offset_s) * 1e6)

    def _write(self, event: dict[str, Any]) -> None:
        line = _encode(event)
        self._file.write(line + b"\n" if self._first else b"," + line + b"\n")
        self._first = False
        self.events += 1


def _open_for_append(path: Path) -> tuple[Any, bool]:
    """The file opened to append events, and whether the next one is its first.

    A line torn by a crash is cut, and a closing bracket (a trace finished elsewhere) too.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.read_bytes() if path.exists() else b""
    keep = data[: data.rfind(b"\n") + 1]  # whole lines only
    if keep.rstrip().endswith(b"]"):
        keep = keep[: keep.rstrip().rfind(b"]")]
    if not keep.strip():
        keep = b"[\n"
    if keep != data:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(keep)
        os.replace(tmp, path)
    first = keep.strip() == b"["
    return open(path, "ab"), first  # lives with the service


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The events of a trace written by :class:`TraceLog`, running or finished; a torn
    last line is skipped. ValueError if the file is not such a trace."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if not lines or lines[0].strip() != "[":
        raise ValueError(f"{path} does not start with '[': not a trace in the array format")
    events: list[dict[str, Any]] = []
    for number, line in enumerate(lines[1:], start=2):
        body = line.strip().removeprefix(",")
        if not body or body == "]":
            continue
        try:
            events.append(json.loads(body))
        except ValueError:
            if number == len(lines):
                break  # torn by a crash, or being written now
            raise ValueError(f"{path}:{number} is not a JSON event") from None
    return events
