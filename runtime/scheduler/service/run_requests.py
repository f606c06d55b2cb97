"""Requests about the run as a whole: Report (a worker's measurement that belongs to no
lease: reports.py), Status (the summary an operator or a worker reads), Stop (drain).

Each handler takes the service whose state it reads and changes (service.py holds the
state and says which handler answers which message).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import structlog

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.scheduler.core.status import summarize
from asyncrl.transport import protocol as p
from asyncrl.transport.topics import Topic, topic

from .metrics import plain

if TYPE_CHECKING:
    from .handler_context import HandlerContext

__all__ = ["report", "status", "status_summary", "stop"]

log = structlog.get_logger("asyncrl.scheduler")

_REPORT_FIELDS = frozenset({"version", "worker", "elapsed_s"})


def report(service: HandlerContext, m: p.Report, now: float) -> p.Message:
    reports = service.reports.get(m.name)
    if reports is None:
        return p.Error(Reason.BAD_REQUEST, f"report {m.name!r} is not one this run keeps")
    if m.worker not in service.core.state.workers:
        return p.Error(Reason.UNKNOWN_WORKER, f"worker {m.worker!r} is not registered")
    # The line's own fields win over a report's keys of the same name.
    data = {k: v for k, v in m.data.items() if k not in _REPORT_FIELDS}
    unwritable = _not_json(data)
    if unwritable is not None:
        return p.Error(Reason.BAD_REQUEST, f"report {m.name!r}: {unwritable}")
    line = {"elapsed_s": round(now - service.started_at, 3), "worker": m.worker, **data}
    if reports.record(m.version, line):
        # A worker's weight load is one line per follower per version (weight_loads.jsonl
        # keeps them all): at scale, info would drown the log in them.
        level = log.debug if reports.per_worker else log.info
        level(m.name, worker=m.worker, version=m.version, **_scalars(data))
        if m.name == "weights":
            service.trace.weights_report(m.worker, m.version, data, now)
        service.emit(topic(Topic.METRICS, m.name), {"version": m.version, **data})
    return p.Ack()


def _not_json(data: dict[str, Any]) -> str | None:
    """What in a report's data its JSON-lines file cannot hold (bytes, say); None if all."""
    for key, value in data.items():
        try:
            json.dumps(value, default=plain)
        except (TypeError, ValueError) as error:
            return f"field {key!r}: {error}"
    return None


def status(service: HandlerContext, _m: p.Status, now: float) -> p.Message:
    return p.StatusReply(status_summary(service, now))


def stop(service: HandlerContext, m: p.Stop, _now: float) -> p.Message:
    service.drain(f"stop requested: {m.reason}")
    return p.Ack(len(service.core.state.leases))


def status_summary(service: HandlerContext, now: float) -> dict[str, Any]:
    """The status reply's summary: the core's, with the run, the journal, the weights'
    routes, the payload stores, the requests answered and the loop's timings."""
    core = service.core
    summary = summarize(core.state)
    for name, worker in summary["workers"].items():
        seen = core.last_seen.get(name)
        worker["last_heartbeat_s_ago"] = None if seen is None else round(now - seen, 3)
    steps = core.state.steps_done
    summary["run"] = {
        "name": service.run_name,
        "steps": f"{steps}/{service.plan.total_steps}",
        "finished": service.finished,
        "draining": service.draining,
        "uptime_s": round(now - service.started_at, 3),
    }
    summary["staleness"] = {
        "max_staleness": core.settings.max_staleness,
        "lag_policy_behind_steps": steps - core.state.policy_version,
        "worst_trained": summary.pop("worst_staleness_trained"),
    }
    summary["refused"] = {str(k): v for k, v in sorted(core.rejections.items())}
    summary["protocol_errors"] = service.protocol_errors
    writer = service.durable.writer
    summary["journal"] = {"records": writer.last_seq, "durable": writer.durable_seq}
    summary["weights"] = service.routes.summary()
    if "critic" in summary:
        summary["critic"]["weights"] = service.critic_routes.summary()
    summary["payload_stores"] = dict(service.stores)  # as each holder last reported
    summary["requests"] = dict(service.requests)
    summary["loop"] = service.timings.summary()  # where the daemon's turns go
    return summary


def _scalars(data: p.Payload) -> dict[str, Any]:
    """A report's plain values, for its log line (structlog's own key left out)."""
    return {
        k: v for k, v in data.items() if k != "event" and isinstance(v, int | float | str | bool)
    }
