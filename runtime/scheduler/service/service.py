"""The scheduler service: bus messages in, replies and events out, around the durable core.

Like the core it wraps, the service opens no socket and reads no clock (``now`` comes with
every call), so the ZeroMQ daemon and the in-process hub run the same code. It turns each
request into core commands, each core answer into a reply, and each notice into a
numbered event; it knows when the run is over.

:class:`SchedulerService` holds the state (the core, the step path, the weights' routes,
the files) and the loop's calls; the requests are answered by handlers grouped by topic
in the modules beside it, each a class given the parts of the state it reads and changes
(:data:`_HANDLERS` says which answers what): membership.py (Hello, Heartbeat, Bye),
lease_requests.py (Claim, Complete, Fail, AddGroups, Held, Lock, Unlock; the metrics line
of each train step is step_lines.py's, with where each role's time went, activity.py, and
the step's critical path, step_path.py), weight_requests.py (PublishVersion, WantWeights,
LoadedVersion, Rewind) and run_requests.py (Report, Status, Stop).

Which replies must wait for the journal is said here, once (:data:`ACKNOWLEDGES_DATA`):
a reply that lets a worker forget something (results, new groups, a version) is sent only
after the records behind it are journaled, so a crash of the scheduler loses nothing a
worker already dropped. Leases are sent at once: a lease lost in a crash is harmless,
because a restart starts a new fence epoch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from asyncrl.runtime.contract.stages import Gate, GroupState, Role
from asyncrl.runtime.scheduler.core import SchedulerCore
from asyncrl.runtime.scheduler.core.effects import (
    CriticRolledBackTo,
    Notice,
    RolledBackTo,
    Transition,
    WorkerLost,
)
from asyncrl.runtime.scheduler.core.starvation import why_no_step
from asyncrl.runtime.scheduler.core.status import filtering, summarize
from asyncrl.runtime.scheduler.durable import JournaledCore
from asyncrl.transport import protocol as p
from asyncrl.transport.topics import Topic, topic

from .activity import RoleActivity
from .lease_requests import LeaseRequests
from .loop_timings import LoopTimings
from .membership import Membership, ReadyTerms
from .metrics import MetricsLog
from .notice_events import EventNumbering
from .payload_refs import PayloadStores
from .reports import ReportLog
from .run_plan import RunPlan
from .run_progress import RunProgress
from .run_requests import RunRequests
from .step_lines import StepLines
from .step_path import StepPath
from .trace import NO_TRACE, Trace
from .waiting import WaitingWorkers
from .weight_requests import WeightRequests
from .weight_routes import WeightRoutes

__all__ = ["ACKNOWLEDGES_DATA", "SchedulerService"]

log = structlog.get_logger("asyncrl.scheduler")

ACKNOWLEDGES_DATA = frozenset(
    {
        p.Kind.HELLO,
        p.Kind.COMPLETE,
        p.Kind.FAIL,
        p.Kind.UNLOCK,
        p.Kind.PUBLISH_VERSION,
        p.Kind.LOADED_VERSION,
        p.Kind.ADD_GROUPS,
        p.Kind.BYE,
        # A Drop lets a holder free payloads: only once their groups' moves are journaled,
        # or a restarted scheduler could refer to bytes nobody keeps.
        p.Kind.HELD,
        p.Kind.REWIND,
    }
)
"""Requests whose reply is held until the journal holds what the request changed."""


class SchedulerService:
    """The scheduler's state around the durable core, and the calls its loop makes."""

    def __init__(
        self,
        durable: JournaledCore,
        plan: RunPlan,
        metrics: MetricsLog,
        *,
        run_name: str,
        heartbeat_interval_s: float,
        max_message_bytes: int,
        started_at: float,
        reports: Mapping[str, ReportLog] | None = None,
        relay_fanout: int = 2,
        trace: Trace = NO_TRACE,
        stall_warning_s: float = 60.0,
        validating_role: str | None = None,
    ) -> None:
        self.durable = durable
        # The role whose worker validates the run's versions (None: the run never does):
        # at the end of the run the scheduler stays for its validation of the last one.
        self.validating_role = validating_role
        self.core: SchedulerCore = durable.core
        self.plan = plan
        self.metrics = metrics
        self.reports: Mapping[str, ReportLog] = reports or {}
        self.trace = trace  # trace.json: leases, versions, steps (see trace.py)
        self.routes = WeightRoutes(relay_fanout)  # not journaled: see weight_routes.py
        self.critic_routes = WeightRoutes(relay_fanout)  # the learned critic's versions
        self.activity = RoleActivity(started_at)
        step = self.core.pipeline.gated(Gate.STEP)
        self.path = StepPath(step.source, step.working)
        self._now = started_at  # the time of the request or tick being settled
        self.terms = ReadyTerms(run_name, heartbeat_interval_s, max_message_bytes)
        self.started_at = started_at
        # No step for this long: a warning says which role starves and why (starvation.py),
        # again each time as long passes.
        self.stall_warning_s = stall_warning_s
        self.progress = RunProgress(plan, started_at)
        self.events = EventNumbering()
        self.outbox: list[p.Event] = []
        self._followers: list[tuple[str, dict[str, Any]]] = []  # events after this commit's
        self.protocol_errors = 0
        self.expired_leases = 0  # ended by the clock, since this process started
        self.payloads = PayloadStores()  # the workers' stores, as their results and Held say
        self.waiting = WaitingWorkers(self.core.pipeline)  # whom the next work wakes
        self.requests: Counter[str] = Counter()  # answered since this process started, by kind
        self.timings = LoopTimings()  # the daemon's turns, part by part (loop_timings.py)
        # The request handlers, by topic, each given what it reads and changes.
        core = self.core
        self.membership = Membership(
            core, self.terms, self.payloads, self.routes, self.critic_routes
        )
        step_lines = StepLines(
            core.state,
            self.progress,
            self.path,
            self.activity,
            self.reports,
            metrics,
            trace,
            self.emit,
            core.settings.max_filtered_in_a_row,
        )
        self.lease_requests = LeaseRequests(
            core,
            self.progress,
            self.waiting,
            self.payloads,
            self.path,
            self.activity,
            trace,
            step_lines,
            lambda: self.awaits_final_validation,
            # A harness validates through the generators' API: they stay for it too.
            frozenset({Role.GENERATE.value})
            if validating_role == Role.HARNESS.value
            else frozenset(),
        )
        self.weight_requests = WeightRequests(
            core, self.routes, self.critic_routes, self.path, trace, self.emit, self.lease_requests
        )
        self.run_requests = RunRequests(
            core, self.reports, started_at, trace, self.emit, self.status, self.drain
        )
        metrics.reconcile(self.core.state.steps_done)
        if self.finished:
            self.progress.draining = p.RUN_FINISHED

    # --- the loop's calls ------------------------------------------------------------

    def handle(self, message: p.Message, now: float) -> p.Message:
        """The reply to one request, its changes journaled and its events in the outbox.
        Never raises for a bad request: it gets an Error."""
        reply = self.answer(message, now)
        self.settle()
        return reply

    def answer(self, message: p.Message, now: float) -> p.Message:
        """The reply to one request; what it changed waits for :meth:`settle`.

        The daemon sends a reply that need not wait for the journal (a lease) before it
        settles, so the worker's wait does not include the journal's bookkeeping and the
        events. The core's state has already changed when this returns; settle before the
        next request is answered, and before asking the journal what a reply waits for.
        """
        handler = _HANDLERS.get(type(message))
        self.requests[type(message).__name__] += 1
        self._now = now
        if handler is None:
            return p.Error(
                "bad_request", f"{type(message).__name__} is not a request to the scheduler"
            )
        return handler(self, message, now)

    def tick(self, now: float) -> None:
        """Expire overdue leases and silent workers."""
        self._now = now
        ended = self.core.tick(now)
        if ended:
            log.warning("leases ended by the clock", leases=ended)
            self.expired_leases += ended
        self.trace.sweep(self.core.state.leases, now)
        self.trace.tick(now)
        self.settle()
        self._warn_if_stalled(now)

    def _warn_if_stalled(self, now: float) -> None:
        progress = self.progress
        if self.finished or progress.draining is not None:
            return
        since = max(progress.progress_at, progress.stall_warned_at or progress.progress_at)
        if now - since < self.stall_warning_s:
            return
        progress.stall_warned_at = now
        quiet = now - progress.progress_at
        why = why_no_step(self.core.state, self.core.settings, self.core.pipeline)
        log.warning(f"no train step for {quiet:.0f} s: {why}", stalled_s=round(quiet, 1))

    def protocol_error(self, detail: str) -> p.Error:
        self.protocol_errors += 1
        return p.Error("protocol", detail)

    def take_events(self) -> list[p.Event]:
        events, self.outbox = self.outbox, []
        return events

    @property
    def finished(self) -> bool:
        return self.progress.finished(self.core.state.steps_done)

    @property
    def draining(self) -> str | None:
        """Why no new leases are handed out (None while they are)."""
        return self.progress.draining

    @property
    def idle(self) -> bool:
        """Nothing is leased: a drain may end."""
        return not self.core.state.leases

    @property
    def awaits_final_validation(self) -> bool:
        """The run is finished and a worker that validates is still here without having
        reported the last version's validation: the scheduler stays to write it down.
        That worker leaves once it has; one that dies is forgotten by its silence."""
        validations = self.reports.get("validation")
        if not self.finished or self.validating_role is None or validations is None:
            return False
        last = validations.latest
        if last is not None and last["version"] >= self.plan.total_steps:
            return False
        return any(w.role == self.validating_role for w in self.core.state.workers.values())

    @property
    def failure(self) -> str | None:
        """Why the run cannot go on, if it cannot: the scheduler drains and exits saying so."""
        return self.progress.failure

    def fail_run(self, reason: str) -> None:
        """The run cannot go on: no new leases; the scheduler exits with ``reason`` once
        the leases out are settled."""
        if self.progress.failure is None:
            self.progress.failure = reason
            log.error("the run cannot go on", reason=reason)
            self.drain(reason)

    def drain(self, reason: str) -> None:
        if self.progress.draining is None:
            self.progress.draining = reason
            log.info("draining", reason=reason)
            self.emit(topic(Topic.RUN, "draining"), {"reason": reason})
            self.settle()

    def close_files(self) -> None:
        """Close the metrics and report files (the journal is the durable core's)."""
        self.metrics.close()
        for reports in self.reports.values():
            reports.close()
        self.trace.close()

    # --- status ----------------------------------------------------------------------

    def status(self, now: float) -> dict[str, Any]:
        """The status reply's summary: the core's, with the run, the newest step's
        training-inference mismatch and learning figures, the journal, the weights' routes,
        the payload stores, the requests answered and the loop's timings."""
        core = self.core
        summary = summarize(core.state)
        for name, worker in summary["workers"].items():
            seen = core.last_seen.get(name)
            worker["last_heartbeat_s_ago"] = None if seen is None else round(now - seen, 3)
        steps = core.state.steps_done
        summary["run"] = {
            "name": self.terms.run_name,
            "steps": f"{steps}/{self.plan.total_steps}",
            "finished": self.finished,
            "draining": self.progress.draining,
            "uptime_s": round(now - self.started_at, 3),
        }
        summary["staleness"] = {
            "max_staleness": core.settings.max_staleness,
            "lag_policy_behind_steps": steps - core.state.policy_version,
            "worst_trained": summary.pop("worst_staleness_trained"),
        }
        if self.progress.mismatch:
            summary["mismatch"] = dict(self.progress.mismatch)
        bound = core.settings.max_filtered_in_a_row
        if bound or core.state.counts[GroupState.FILTERED]:
            summary["filtered"] = filtering(core.state, bound)
        if self.progress.failure is not None:
            summary["run"]["failure"] = self.progress.failure
        if self.progress.learning:
            summary["learning"] = dict(self.progress.learning)
        summary["refused"] = {str(k): v for k, v in sorted(core.rejections.items())}
        summary["protocol_errors"] = self.protocol_errors
        writer = self.durable.writer
        summary["journal"] = {"records": writer.last_seq, "durable": writer.durable_seq}
        summary["weights"] = self.routes.summary()
        if "critic" in summary:
            summary["critic"]["weights"] = self.critic_routes.summary()
        summary["payload_stores"] = dict(self.payloads.reported)  # as each last reported
        summary["requests"] = dict(self.requests)
        summary["loop"] = self.timings.summary()  # where the daemon's turns go
        return summary

    # --- events ----------------------------------------------------------------------

    def settle(self) -> None:
        """Journal what changed since the last call (requests answered, a tick); queue
        events announcing the core's moves, then what followed from them."""
        notices = self.durable.commit()
        first = len(self.outbox)
        if notices:
            _log_losses(notices)
            self.path.moved((n for n in notices if isinstance(n, Transition)), self._now)
            for notice in notices:
                if isinstance(notice, WorkerLost):  # timed out or left: it serves no weights
                    self.waiting.claimed(notice.worker)
                    self.routes.forget(notice.worker)
                    self.critic_routes.forget(notice.worker)
                    self.payloads.forget(notice.worker)
                elif isinstance(notice, RolledBackTo):
                    self._rolled_back(notice)
                    self.payloads.refs.forget()  # groups came back under new ids
                elif isinstance(notice, CriticRolledBackTo):
                    # Only the critic's updates are lost: no policy step or line to cut.
                    log.warning("the critic rolled back", step=notice.step, reason=notice.reason)
            self.outbox.extend(self.events.from_notices(notices))
        for name, body in self._followers:
            self.outbox.append(self.events.make(name, body))
        self._followers.clear()
        if len(self.outbox) > first:
            moves = [(e.topic, e.body) for e in self.outbox[first:]]
            self.outbox.extend(self.events.make(t, {}) for t in self.waiting.to_wake(moves))
        if notices and self.progress.failure is None:
            why = self.core.filter_bound_passed()
            if why is not None:
                self.fail_run(why)

    def _rolled_back(self, notice: RolledBackTo) -> None:
        """Nothing of the lost steps may be offered again: their weights and their lines.
        (The critic's versions are never rolled back: its routes stay.)"""
        self.routes.forget_after(notice.step)
        cut = self.metrics.reconcile(notice.step)
        if self.progress.mismatch.get("step", 0) > notice.step:
            self.progress.mismatch = {}  # its line is cut with the lost steps'
        if self.progress.learning.get("step", 0) > notice.step:
            self.progress.learning = {}
        log.warning(
            "training rolled back",
            step=notice.step,
            trained_again=notice.trained_again,
            metrics_lines_cut=cut,
            reason=notice.reason,
        )

    def emit(self, name: str, body: dict[str, Any]) -> None:
        """Queue an event that follows from this commit's moves (sent after them)."""
        self._followers.append((name, body))


def _log_losses(notices: list[Notice]) -> None:
    """Work that went back or died is worth a line: it is how an operator finds a fault."""
    for notice in notices:
        if isinstance(notice, WorkerLost):
            log.warning("worker lost", worker=notice.worker, reason=notice.reason)
        elif isinstance(notice, Transition) and notice.target is GroupState.FILTERED:
            # dynamic sampling at work, not a fault: counted in the status and the metrics
            log.debug("groups filtered", groups=list(notice.groups[:20]), reason=notice.reason)
        elif isinstance(notice, Transition) and notice.reason is not None:
            level = log.error if notice.target is GroupState.DEAD else log.warning
            level(
                "groups went back" if notice.target is not GroupState.DEAD else "groups died",
                groups=list(notice.groups[:20]),
                to=notice.target.value,
                reason=notice.reason,
            )


Handler = Callable[[SchedulerService, Any, float], p.Message]

_HANDLERS: dict[type, Handler] = {
    p.Hello: lambda s, m, now: s.membership.hello(m, now),
    p.Heartbeat: lambda s, m, now: s.membership.heartbeat(m, now),
    p.Bye: lambda s, m, now: s.membership.bye(m, now),
    p.Claim: lambda s, m, now: s.lease_requests.claim(m, now),
    p.Complete: lambda s, m, now: s.lease_requests.complete(m, now),
    p.Fail: lambda s, m, now: s.lease_requests.fail(m, now),
    p.Lock: lambda s, m, now: s.lease_requests.lock(m, now),
    p.Unlock: lambda s, m, now: s.lease_requests.unlock(m, now),
    p.AddGroups: lambda s, m, now: s.lease_requests.add_groups(m, now),
    p.Held: lambda s, m, now: s.lease_requests.held(m, now),
    p.PublishVersion: lambda s, m, now: s.weight_requests.publish(m, now),
    p.LoadedVersion: lambda s, m, now: s.weight_requests.loaded(m, now),
    p.WantWeights: lambda s, m, now: s.weight_requests.want_weights(m, now),
    p.Rewind: lambda s, m, now: s.weight_requests.rewind(m, now),
    p.Report: lambda s, m, now: s.run_requests.report(m, now),
    p.Status: lambda s, m, now: s.run_requests.status(m, now),
    p.Stop: lambda s, m, now: s.run_requests.stop(m, now),
}
"""Which handler answers each request: each is given the service, the request and the
time it is answered at, and asks the handler of the request's topic."""
