"""``/metrics``: the scheduler's state for Prometheus, served by prometheus-client.

The scheduler's loop owns the service and nothing else may read it while it runs, so the
loop takes a snapshot once a second (:meth:`LiveMetrics.refresh`, on its tick) and the
HTTP server's thread turns the newest snapshot into metric families when scraped: a
scrape never touches the core, and costs the loop nothing. A snapshot is the status
summary (the work of one ``asyncrl-scheduler status``) plus the per-role activity window.

Served on ``scheduler.metrics_host:metrics_port`` (loopback by default): a port opened only
when asked for, readable by anyone who can reach it, so it carries counts, never payloads
or keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from asyncrl.runtime.contract.stages import GroupState

if TYPE_CHECKING:
    from .service import SchedulerService

__all__ = ["LiveMetrics", "serve_metrics"]

_PREFIX = "asyncrl_"


class LiveMetrics(Collector):
    def __init__(self, service: SchedulerService, every_s: float = 1.0) -> None:
        self.service = service
        self.every_s = every_s
        self._taken_at: float | None = None
        self._snapshot: dict[str, Any] | None = None  # swapped whole: readers see one or the other

    def refresh(self, now: float) -> None:
        """On the scheduler's loop: take a snapshot if the last one is ``every_s`` old."""
        if self._taken_at is not None and now - self._taken_at < self.every_s:
            return
        service = self.service
        summary = service.status(now)
        workers: dict[str, int] = {}
        for w in summary["workers"].values():
            workers[w["role"]] = workers.get(w["role"], 0) + 1
        summary["roles"] = service.activity.rates(now, workers)
        summary["workers_per_role"] = workers
        summary["expired_leases"] = service.expired_leases
        summary["total_steps"] = service.plan.total_steps
        self._snapshot, self._taken_at = summary, now

    def collect(self) -> Iterator[Metric]:
        """On the HTTP server's thread: the newest snapshot as metric families."""
        s = self._snapshot
        if s is None:
            return
        groups = {state.value: s["groups"].get(state.value, 0) for state in GroupState}
        yield _labelled("groups", "sample groups per state", "state", groups)
        yield _counter("groups_created", "sample groups created", s["created"])
        leases = {role: s["leases"].get(role, 0) for role in s["workers_per_role"]}
        yield _labelled("leases", "leases held, per role", "role", {**leases, **s["leases"]})
        yield _labelled("workers", "registered workers, per role", "role", s["workers_per_role"])
        yield _counter("lease_expiries", "leases ended by the clock", s["expired_leases"])
        refused = CounterMetricFamily(
            _PREFIX + "refused",
            "requests refused, per reason (stale_fence among them)",
            labels=["reason"],
        )
        for reason, count in s["refused"].items():
            refused.add_metric([reason], count)
        yield refused
        yield _counter(
            "stale_fences",
            "completions refused for a stale fence",
            s["refused"].get("stale_fence", 0),
        )
        yield _counter(
            "protocol_errors", "frames that were not valid messages", s["protocol_errors"]
        )
        yield _gauge("policy_version", "newest published policy version", s["policy_version"])
        yield _gauge("steps_done", "train steps done", s["steps_done"])
        yield _gauge("total_steps", "train steps the run is to take", s["total_steps"])
        stale = s["staleness"]
        yield _gauge("max_staleness", "configured staleness bound", stale["max_staleness"])
        yield _gauge(
            "policy_lag_steps",
            "steps done minus the published version",
            stale["lag_policy_behind_steps"],
        )
        if stale["worst_trained"] is not None:
            yield _gauge(
                "worst_staleness_trained",
                "most versions any trained token lagged",
                stale["worst_trained"],
            )
        journal = s["journal"]
        yield _gauge("journal_records", "journal records written", journal["records"])
        yield _gauge(
            "journal_lag_records",
            "journal records not yet fsynced",
            journal["records"] - journal["durable"],
        )
        yield _gauge("uptime_seconds", "seconds since this scheduler started", s["run"]["uptime_s"])
        tokens = GaugeMetricFamily(
            _PREFIX + "role_tokens_per_second",
            "tokens per second over the last 30 s, per role",
            labels=["role"],
        )
        share = GaugeMetricFamily(
            _PREFIX + "role_time_share",
            "share of a role's reported time per bucket over the last 30 s "
            "(waiting_for_work: idle)",
            labels=["role", "bucket"],
        )
        for role, r in s["roles"].items():
            tokens.add_metric([role], r.get("tokens_per_s", 0.0))
            for bucket, value in r.items():
                if bucket not in ("workers", "tokens_per_s", "reported_s"):
                    share.add_metric([role, bucket], value)
        yield tokens
        yield share


def serve_metrics(live: LiveMetrics, host: str, port: int) -> Any:
    """Serve ``live`` at http://host:port/metrics from a daemon thread; returns the server
    (``shutdown()`` it at exit)."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(live)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(_PREFIX + name, text, value=value)


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(_PREFIX + name, text, value=value)


def _labelled(name: str, text: str, label: str, values: dict[str, Any]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(_PREFIX + name, text, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family
