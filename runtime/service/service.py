"""The scheduler service: bus messages in, replies and events out, around the durable core.

Like the core it wraps, the service opens no socket and reads no clock (``now`` comes with
every call), so the ZeroMQ daemon and the in-process hub run the same code. It turns each
request into core commands, each core answer into a reply, and each notice into a
numbered event; it writes one metrics line per train step (with where each role's time
went, activity.py, and the step's critical path, step_path.py); it knows when the run is
over.

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

from asyncrl.runtime.bus import ACTIVITY_KEY
from asyncrl.runtime.core import SchedulerCore
from asyncrl.runtime.core.effects import (
    Accepted,
    Grant,
    LockGranted,
    LockQueued,
    Notice,
    Reason,
    Rejected,
    RolledBackTo,
    Transition,
    WorkerLost,
)
from asyncrl.runtime.core.pipeline import Gate, GroupState
from asyncrl.runtime.core.starvation import why_no_step
from asyncrl.runtime.core.status import summarize
from asyncrl.runtime.durable import JournaledCore
from asyncrl.transport import protocol as p
from asyncrl.transport.topics import Topic, topic

from .activity import RoleActivity
from .events import EventNumbering
from .metrics import MetricsLog
from .payload_refs import holder_of, lease_item, live_keys, stored
from .reports import ReportLog, step_fields
from .step_path import StepPath
from .trace import NO_TRACE, Trace
from .weight_routes import NoRoute, WeightRoutes

__all__ = ["ACKNOWLEDGES_DATA", "RunPlan", "SchedulerService"]

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


class RunPlan:
    """How much work the run has and how much may wait in the entry state."""

    def __init__(self, total_steps: int, batch_groups: int, max_staleness: int) -> None:
        self.total_steps = total_steps
        self.total_groups = total_steps * batch_groups
        # Enough queued prompts for every generator to be busy up to the staleness bound.
        self.backlog = batch_groups * (max_staleness + 2)


class SchedulerService:
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
    ) -> None:
        self.durable = durable
        self.core: SchedulerCore = durable.core
        self.plan = plan
        self.metrics = metrics
        self.reports: Mapping[str, ReportLog] = reports or {}
        self.trace = trace  # trace.json: leases, versions, steps (see trace.py)
        self.routes = WeightRoutes(relay_fanout)  # not journaled: see weight_routes.py
        self.activity = RoleActivity(started_at)
        step, admit = self.core.pipeline.gated(Gate.STEP), self.core.pipeline.gated(Gate.ADMIT)
        self.path = StepPath(step.source, step.working)
        self._step_role, self._generator_role = step.role, admit.role
        self._now = started_at  # the time of the request or tick being settled
        self.run_name = run_name
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_message_bytes = max_message_bytes
        self.started_at = started_at
        # No step for this long: a warning says which role starves and why (starvation.py),
        # again each time as long passes.
        self.stall_warning_s = stall_warning_s
        self._progress_at = started_at  # the last step, or the start
        self._stall_warned_at: float | None = None
        self.events = EventNumbering()
        self.outbox: list[p.Event] = []
        self._followers: list[tuple[str, dict[str, Any]]] = []  # events after this commit's
        self.draining: str | None = None  # why no new leases are handed out
        self.protocol_errors = 0
        self.expired_leases = 0  # ended by the clock, since this process started
        self.stores: dict[str, dict[str, int]] = {}  # worker -> what its payload store holds
        self.requests: Counter[str] = Counter()  # answered since this process started, by kind
        self._handlers: dict[type, Callable[[Any, float], p.Message]] = {
            p.Hello: self._hello,
            p.Heartbeat: self._heartbeat,
            p.Claim: self._claim,
            p.Complete: self._complete,
            p.Fail: self._fail,
            p.Lock: self._lock,
            p.Unlock: self._unlock,
            p.PublishVersion: self._publish,
            p.LoadedVersion: self._loaded,
            p.AddGroups: self._add_groups,
            p.Bye: self._bye,
            p.Report: self._report,
            p.WantWeights: self._want_weights,
            p.Held: self._held,
            p.Rewind: self._rewind,
            p.Status: self._status,
            p.Stop: self._stop,
        }
        metrics.reconcile(self.core.state.steps_done)
        if self.finished:
            self.draining = "the run is finished"

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
        handler = self._handlers.get(type(message))
        self.requests[type(message).__name__] += 1
        self._now = now
        if handler is None:
            return p.Error(
                "bad_request", f"{type(message).__name__} is not a request to the scheduler"
            )
        return handler(message, now)

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
        if self.finished or self.draining is not None:
            return
        since = max(self._progress_at, self._stall_warned_at or self._progress_at)
        if now - since < self.stall_warning_s:
            return
        self._stall_warned_at = now
        quiet = now - self._progress_at
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
        return self.core.state.steps_done >= self.plan.total_steps

    @property
    def idle(self) -> bool:
        """Nothing is leased: a drain may end."""
        return not self.core.state.leases

    def drain(self, reason: str) -> None:
        if self.draining is None:
            self.draining = reason
            log.info("draining", reason=reason)
            self._emit(topic(Topic.RUN, "draining"), {"reason": reason})
            self.settle()

    def close_files(self) -> None:
        """Close the metrics and report files (the journal is the durable core's)."""
        self.metrics.close()
        for reports in self.reports.values():
            reports.close()
        self.trace.close()

    # --- handlers --------------------------------------------------------------------

    def _hello(self, m: p.Hello, now: float) -> p.Message:
        if m.protocol != p.PROTOCOL_VERSION:
            return p.Error(
                "protocol",
                f"worker speaks protocol {m.protocol}; this scheduler speaks "
                f"{p.PROTOCOL_VERSION}: install the same asyncrl version on both sides",
            )
        reply = self.core.register(m.worker, m.role, now)
        if isinstance(reply, Rejected):
            return _error(reply)
        log.info("worker registered", worker=m.worker, role=m.role, pid=m.pid)
        settings = self.core.settings
        return p.Ready(
            m.worker,
            self.run_name,
            p.PROTOCOL_VERSION,
            self.heartbeat_interval_s,
            settings.lease_timeout,
            self.max_message_bytes,
            self.core.state.policy_version,
            self.core.state.steps_done,
        )

    def _heartbeat(self, m: p.Heartbeat, now: float) -> p.Message:
        held = None if m.leases is None else list(m.leases)
        return _reply(self.core.heartbeat(m.worker, now, held))

    def _claim(self, m: p.Claim, now: float) -> p.Message:
        if self.draining is not None:
            return p.Shutdown(self.draining)
        if m.role == self.core.pipeline.entry_role:
            return self._want(m)
        grant = self.core.claim(m.role, m.worker, m.n, now)
        if grant is None:
            return p.NoWork("nothing to do now")
        if isinstance(grant, Rejected):
            return _error(grant)
        if grant.role == self._step_role:
            self.path.leased(grant.lease_id, now)
        self.trace.granted(grant, m.worker, now)
        return self._lease(grant, now)

    def _want(self, m: p.Claim) -> p.Message:
        refused = self._not_the_entry_role(m.worker)
        if refused is not None:
            return refused
        counts = self.core.state.counts
        alive = sum(counts[s] for s in GroupState if s not in (GroupState.TRAINED, GroupState.DEAD))
        needed = self.plan.total_groups - counts[GroupState.TRAINED] - alive
        room = self.plan.backlog - counts[self.core.pipeline.entry]
        return p.Want(max(0, min(m.n, needed, room)))

    def _not_the_entry_role(self, worker: str) -> p.Error | None:
        known = self.core.state.workers.get(worker)
        if known is None:  # its own code, so the worker knows to register again
            return p.Error(Reason.UNKNOWN_WORKER, f"worker {worker!r} is not registered")
        if known.role != self.core.pipeline.entry_role:
            return p.Error(Reason.WRONG_ROLE, f"{worker!r} is registered as {known.role}")
        return None

    def _lease(self, grant: Grant, now: float) -> p.Lease:
        groups = self.core.state.groups
        items = tuple(lease_item(g, groups[g].key, groups[g].data) for g in grant.groups)
        return p.Lease(
            grant.lease_id, grant.fence, grant.role, grant.expires_at - now, grant.version, items
        )

    def _complete(self, m: p.Complete, now: float) -> p.Message:
        lease = self.core.state.leases.get(m.lease_id)
        gids = [r.gid for r in m.results]
        versions = [r.behaviour for r in m.results]
        behaviour = None if all(v is None for v in versions) else versions
        if behaviour is not None and any(v is None for v in behaviour):
            return p.Error(Reason.BAD_RESULT, "either every result carries versions or none")
        holder = lease.worker if lease is not None else m.worker
        foreign = [r.gid for r in m.results if r.ref is not None and r.ref.holder != holder]
        if foreign:
            return p.Error(Reason.BAD_RESULT, f"groups {foreign[:5]}: payloads held by another")
        data = [stored(r) for r in m.results]
        steps_before = self.core.state.steps_done
        reply = self.core.complete(m.lease_id, m.fence, gids, behaviour, data, m.durable_step)
        if isinstance(reply, Rejected):
            return _error(reply)
        if lease is not None:
            self.activity.add(lease.role, (m.metrics or {}).get(ACTIVITY_KEY), now)
        self.trace.settled(m.lease_id, "complete", self.core.state.leases, now)
        if self.core.state.steps_done > steps_before:
            self._record_step(m, lease.worker if lease else m.worker, gids, now)
            return p.StepDone(reply.count, self.core.state.steps_done)
        return p.Ack(reply.count)

    def _record_step(self, m: p.Complete, worker: str, gids: list[int], now: float) -> None:
        state = self.core.state
        self._progress_at, self._stall_warned_at = now, None
        path = self.path.trained(state.steps_done, m.lease_id, gids, now)
        line = {
            "step": state.steps_done,
            "elapsed_s": round(now - self.started_at, 3),
            "policy_version": state.policy_version,
            "worker": worker,
            **{k: v for k, v in (m.metrics or {}).items() if k != ACTIVITY_KEY},
            **step_fields(self.reports),
            "roles": self.activity.rates(now, self._workers_per_role()),
            "critical_path": path,
            "payloads_regenerated": sum(state.regenerated.values()),
        }
        reached = self.path.take_reached()  # earlier steps' versions, now run by every generator
        if reached:
            line["versions_loaded"] = reached
        self.metrics.append(line)
        self.trace.step(state.steps_done, worker, now)
        self._emit(topic(Topic.METRICS, "step"), {"step": state.steps_done})
        if self.finished:
            log.info("run finished", steps=state.steps_done)
            self._emit(topic(Topic.RUN, "finished"), {"steps": state.steps_done})
            self.draining = "the run is finished"

    def _workers_per_role(self) -> dict[str, int]:
        return dict(Counter(w.role for w in self.core.state.workers.values()))

    def _report(self, m: p.Report, now: float) -> p.Message:
        reports = self.reports.get(m.name)
        if reports is None:
            return p.Error(Reason.BAD_REQUEST, f"report {m.name!r} is not one this run keeps")
        if m.worker not in self.core.state.workers:
            return p.Error(Reason.UNKNOWN_WORKER, f"worker {m.worker!r} is not registered")
        # The line's own fields win over a report's keys of the same name.
        data = {k: v for k, v in m.data.items() if k not in _REPORT_FIELDS}
        line = {"elapsed_s": round(now - self.started_at, 3), "worker": m.worker, **data}
        if reports.record(m.version, line):
            log.info(m.name, worker=m.worker, version=m.version, **_scalars(data))
            if m.name == "weights":
                self.trace.weights_report(m.worker, m.version, data, now)
            self._emit(topic(Topic.METRICS, m.name), {"version": m.version, **data})
        return p.Ack()

    def _fail(self, m: p.Fail, now: float) -> p.Message:
        gids = None if m.gids is None else list(m.gids)
        groups, lease = self.core.state.groups, self.core.state.leases.get(m.lease_id)
        lost: list[tuple[p.LostPayload, str]] = []  # each report, with who held the payload
        for x in m.lost:
            if lease is None or x.gid not in lease.gids:
                continue  # another reader reported it first: the group is out of this lease
            holder = holder_of(groups[x.gid].data.get(x.role))
            if holder is None:  # only a reference can be lost on its way
                return p.Error(Reason.BAD_REQUEST, f"group {x.gid} has no {x.role} reference")
            lost.append((x, holder))
        triples = [(x.gid, x.role, x.reason) for x, _ in lost]
        reply = self.core.fail(m.lease_id, m.fence, gids, m.reason, triples)
        if isinstance(reply, Accepted):
            self.trace.settled(m.lease_id, "fail", self.core.state.leases, now)
            log.warning("work failed", worker=m.worker, lease=m.lease_id, reason=m.reason)
            for x, holder in lost:
                log.warning("payload lost", group=x.gid, role=x.role, holder=holder,
                            reader=m.worker, reason=x.reason)  # fmt: skip
        return _reply(reply)

    def _held(self, m: p.Held, _now: float) -> p.Message:
        """Which of a store's keys no live group refers to any more: the store frees them."""
        self.stores[m.worker] = {"payloads": len(m.keys), "bytes": m.bytes}
        live = live_keys((g.data for g in self.core.state.groups.values()), m.store)
        return p.Drop(tuple(k for k in m.keys if k not in live))

    def _lock(self, m: p.Lock, _now: float) -> p.Message:
        reply = self.core.acquire(m.resource, m.lease_id, m.fence)
        if isinstance(reply, LockGranted):
            return p.LockGranted(reply.resource, reply.lease_id, reply.token)
        if isinstance(reply, LockQueued):
            return p.LockQueued(reply.resource, reply.lease_id, reply.position)
        return _error(reply)

    def _unlock(self, m: p.Unlock, _now: float) -> p.Message:
        return _reply(self.core.release(m.resource, m.token))

    def _publish(self, m: p.PublishVersion, now: float) -> p.Message:
        bad = _bad_announcement(m)
        if bad is not None:
            log.warning("bad publication", worker=m.worker, version=m.version, detail=bad)
            return p.Error(Reason.BAD_REQUEST, bad)
        reply = self.core.publish_version(m.worker, m.version)
        if _announces_again(m, self.core.state.policy_version, reply):
            # The current version's weights, offered again after a restart: nothing for the
            # core (versions only go forward), the routes take the new announcement.
            reply = Accepted()
        if isinstance(reply, Accepted):
            self.path.published(m.version, now)
            self.trace.published(m.worker, m.version, now)
            self.routes.announce(m.version, m.worker, m.weights, m.address)
            if m.weights is not None:
                log.info(
                    "weights announced",
                    version=m.version,
                    publisher=m.worker,
                    manifest_bytes=len(p.pack_payload(m.weights)),
                    manifest_keys=sorted(m.weights)[:_NAMES_LOGGED],
                    address_bytes=len(m.address),
                )
        return _reply(reply)

    def _rewind(self, m: p.Rewind, _now: float) -> p.Message:
        reply = self.core.rewind(m.worker, m.step)
        if isinstance(reply, Rejected):
            log.error("rollback refused", worker=m.worker, step=m.step, detail=reply.detail)
        return _reply(reply)

    def _want_weights(self, m: p.WantWeights, _now: float) -> p.Message:
        if m.worker not in self.core.state.workers:  # its own code: the worker registers again
            return p.Error(Reason.UNKNOWN_WORKER, f"worker {m.worker!r} is not registered")
        try:
            if m.version < 0:
                raise ValueError(f"version {m.version} is negative (0 asks for the newest)")
            route = self.routes.route(m.worker, m.version, m.address, m.failed)
        except ValueError as bad:
            log.warning("bad weights request", worker=m.worker, version=m.version, detail=str(bad))
            return p.Error(Reason.BAD_REQUEST, str(bad))
        except NoRoute as none:
            log.info("no weights route", worker=m.worker, version=m.version, detail=none.detail)
            return p.Error(none.code, none.detail)
        if m.failed:
            log.warning("weights source failed", worker=m.worker, failed=m.failed)
        log.info("weights route", worker=m.worker, version=route.version, source=route.source)
        return p.WeightsPlan(route.version, route.manifest, route.source, route.source_address)

    def _loaded(self, m: p.LoadedVersion, now: float) -> p.Message:
        reply = self.core.loaded_version(m.worker, m.version)
        if isinstance(reply, Accepted):
            self.trace.loaded(m.worker, m.version, now)
            everywhere = self._loaded_by_every_generator()
            if everywhere is not None:
                self.path.loaded_everywhere(everywhere, now)
        return _reply(reply)

    def _loaded_by_every_generator(self) -> int | None:
        """The newest version every registered generator runs (or a newer one), if any."""
        role = self._generator_role
        loaded = [w.loaded for w in self.core.state.workers.values() if w.role == role]
        if not loaded or None in loaded:
            return None
        return min(v for v in loaded if v is not None)

    def _add_groups(self, m: p.AddGroups, _now: float) -> p.Message:
        refused = self._not_the_entry_role(m.worker)
        if refused is not None:
            return refused
        keys = [g.key for g in m.groups]
        if len(set(keys)) != len(keys):
            return p.Error(Reason.BAD_REQUEST, "a key appears twice in one request")
        fresh = [g for g in m.groups if g.key not in self.core.state.keys]
        reply = self.core.add_groups(
            [g.key for g in fresh], [p.pack_payload(g.data) for g in fresh]
        )
        if isinstance(reply, Rejected):
            return _error(reply)
        added = tuple(g.key for g in fresh)
        known = set(added)  # once, not per key: a request may carry hundreds of groups
        return p.Added(added, tuple(k for k in keys if k not in known))

    def _bye(self, m: p.Bye, _now: float) -> p.Message:
        log.info("worker left", worker=m.worker, reason=m.reason)
        return _reply(self.core.worker_lost(m.worker, f"left: {m.reason}"))

    def _status(self, _m: p.Status, now: float) -> p.Message:
        return p.StatusReply(self.status(now))

    def _stop(self, m: p.Stop, _now: float) -> p.Message:
        self.drain(f"stop requested: {m.reason}")
        return p.Ack(len(self.core.state.leases))

    # --- status ----------------------------------------------------------------------

    def status(self, now: float) -> dict[str, Any]:
        core = self.core
        summary = summarize(core.state)
        for name, worker in summary["workers"].items():
            seen = core.last_seen.get(name)
            worker["last_heartbeat_s_ago"] = None if seen is None else round(now - seen, 3)
        steps = core.state.steps_done
        summary["run"] = {
            "name": self.run_name,
            "steps": f"{steps}/{self.plan.total_steps}",
            "finished": self.finished,
            "draining": self.draining,
            "uptime_s": round(now - self.started_at, 3),
        }
        summary["staleness"] = {
            "max_staleness": core.settings.max_staleness,
            "lag_policy_behind_steps": steps - core.state.policy_version,
            "worst_trained": summary.pop("worst_staleness_trained"),
        }
        summary["refused"] = {str(k): v for k, v in sorted(core.rejections.items())}
        summary["protocol_errors"] = self.protocol_errors
        writer = self.durable.writer
        summary["journal"] = {"records": writer.last_seq, "durable": writer.durable_seq}
        summary["weights"] = self.routes.summary()
        summary["payload_stores"] = dict(self.stores)  # as each holder last reported
        summary["requests"] = dict(self.requests)
        return summary

    # --- events ----------------------------------------------------------------------

    def settle(self) -> None:
        """Journal what changed since the last call (requests answered, a tick); queue
        events announcing the core's moves, then what followed from them."""
        notices = self.durable.commit()
        if notices:
            _log_losses(notices)
            self.path.moved((n for n in notices if isinstance(n, Transition)), self._now)
            for notice in notices:
                if isinstance(notice, WorkerLost):  # timed out or left: it serves no weights
                    self.routes.forget(notice.worker)
                    self.stores.pop(notice.worker, None)
                elif isinstance(notice, RolledBackTo):
                    self._rolled_back(notice)
            self.outbox.extend(self.events.from_notices(notices))
        for name, body in self._followers:
            self.outbox.append(self.events.make(name, body))
        self._followers.clear()

    def _rolled_back(self, notice: RolledBackTo) -> None:
        """Nothing of the lost steps may be offered again: their weights and their lines."""
        self.routes.forget_after(notice.step)
        cut = self.metrics.reconcile(notice.step)
        log.warning(
            "training rolled back",
            step=notice.step,
            trained_again=notice.trained_again,
            metrics_lines_cut=cut,
            reason=notice.reason,
        )

    def _emit(self, name: str, body: dict[str, Any]) -> None:
        self._followers.append((name, body))


def _log_losses(notices: list[Notice]) -> None:
    """Work that went back or died is worth a line: it is how an operator finds a fault."""
    for notice in notices:
        if isinstance(notice, WorkerLost):
            log.warning("worker lost", worker=notice.worker, reason=notice.reason)
        elif isinstance(notice, Transition) and notice.reason is not None:
            level = log.error if notice.target is GroupState.DEAD else log.warning
            level(
                "groups went back" if notice.target is not GroupState.DEAD else "groups died",
                groups=list(notice.groups[:20]),
                to=notice.target.value,
                reason=notice.reason,
            )


_REPORT_FIELDS = frozenset({"version", "worker", "elapsed_s"})
_NAMES_LOGGED = 8  # manifest keys named in a log line; the manifest itself can be large


def _scalars(data: p.Payload) -> dict[str, Any]:
    """A report's plain values, for its log line (structlog's own key left out)."""
    return {
        k: v for k, v in data.items() if k != "event" and isinstance(v, int | float | str | bool)
    }


def _announces_again(m: p.PublishVersion, policy_version: int, reply: object) -> bool:
    """A trainer's repeat of the current version, carrying its weights: welcome."""
    return (
        isinstance(reply, Rejected)
        and reply.reason == Reason.BAD_VERSION
        and m.weights is not None
        and m.version == policy_version
    )


def _bad_announcement(m: p.PublishVersion) -> str | None:
    """Why a publication's weight-plane fields make no sense, if they do not."""
    if m.weights is not None and not isinstance(m.weights, dict):
        return f"weights of version {m.version} must be a manifest dict, not {type(m.weights)}"
    if m.address and m.weights is None:
        return f"version {m.version} names a weight-plane address but carries no manifest"
    return None


def _error(rejected: Rejected) -> p.Error:
    return p.Error(rejected.reason.value, rejected.detail)


def _reply(answer: Accepted | Rejected) -> p.Message:
    return p.Ack(answer.count) if isinstance(answer, Accepted) else _error(answer)
