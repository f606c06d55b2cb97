"""Requests about the run as a whole: Report (a worker's measurement that belongs to no
lease: reports.py), Status (the summary an operator or a worker reads), Stop (drain).

The handlers are :class:`RunRequests`'s methods, given what they read and change
(service.py builds it and says which handler answers which message).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.scheduler.core.scheduler import SchedulerCore
from asyncrl.transport import protocol as p
from asyncrl.transport.topics import Topic, topic

from .metrics import plain
from .reports import ReportLog
from .trace import Trace

__all__ = ["RunRequests"]

log = structlog.get_logger("asyncrl.scheduler")

_REPORT_FIELDS = frozenset({"version", "worker", "elapsed_s"})


class RunRequests:
    """Report, Status and Stop, given the core, the reports the run keeps, what a report
    is noted in, and the service's status and drain."""

    def __init__(
        self,
        core: SchedulerCore,
        reports: Mapping[str, ReportLog],
        started_at: float,
        trace: Trace,
        emit: Callable[[str, dict[str, Any]], None],
        status_of: Callable[[float], dict[str, Any]],
        drain: Callable[[str], None],
    ) -> None:
        self.core = core
        self.reports = reports
        self.started_at = started_at
        self.trace = trace
        self.emit = emit
        self.status_of = status_of
        self.drain = drain

    def report(self, m: p.Report, now: float) -> p.Message:
        reports = self.reports.get(m.name)
        if reports is None:
            return p.Error(Reason.BAD_REQUEST, f"report {m.name!r} is not one this run keeps")
        if m.worker not in self.core.state.workers:
            return p.Error(Reason.UNKNOWN_WORKER, f"worker {m.worker!r} is not registered")
        # The line's own fields win over a report's keys of the same name.
        data = {k: v for k, v in m.data.items() if k not in _REPORT_FIELDS}
        unwritable = _not_json(data)
        if unwritable is not None:
            return p.Error(Reason.BAD_REQUEST, f"report {m.name!r}: {unwritable}")
        line = {"elapsed_s": round(now - self.started_at, 3), "worker": m.worker, **data}
        if reports.record(m.version, line):
            # A worker's weight load is one line per follower per version (weight_loads.jsonl
            # keeps them all): at scale, info would drown the log in them.
            level = log.debug if reports.per_worker else log.info
            level(m.name, worker=m.worker, version=m.version, **_scalars(data))
            if m.name == "weights":
                self.trace.weights_report(m.worker, m.version, data, now)
            self.emit(topic(Topic.METRICS, m.name), {"version": m.version, **data})
        return p.Ack()

    def status(self, _m: p.Status, now: float) -> p.Message:
        return p.StatusReply(self.status_of(now))

    def stop(self, m: p.Stop, _now: float) -> p.Message:
        self.drain(f"stop requested: {m.reason}")
        return p.Ack(len(self.core.state.leases))


def _not_json(data: dict[str, Any]) -> str | None:
    """What in a report's data its JSON-lines file cannot hold (bytes, say); None if all."""
    for key, value in data.items():
        try:
            json.dumps(value, default=plain)
        except (TypeError, ValueError) as error:
            return f"field {key!r}: {error}"
    return None


def _scalars(data: p.Payload) -> dict[str, Any]:
    """A report's plain values, for its log line (structlog's own key left out)."""
    return {
        k: v for k, v in data.items() if k != "event" and isinstance(v, int | float | str | bool)
    }
