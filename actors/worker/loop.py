"""The worker: one role's code (an :class:`Actor`) driven over one SchedulerLink.

A role subclasses :class:`~..actor.Actor` and fills in hooks; :class:`Worker` does the
talking. Role code never sees a socket, a retry or a heartbeat. The loop::

    Hello → Ready                      register (a protocol mismatch is fatal: exit 1)
    Claim(n) → Lease  → process        → Complete(claim_next=n) (or Fail if process raised)
             → NoWork                  wait for a wake-up event, or poll_s, then claim again
             → Want(k) → feed(k)       → AddGroups (the dataloader)
             → Shutdown                → Bye, exit 0
    Complete(claim_next=n) → Lease     process it, as a Claim's
                           → Ack       wait for a wake-up event, as after NoWork

One loop serves every actor: it claims while the actor has room, ``advance``s in between,
and completes each lease as soon as it is done, asking with the Complete for the work
that fills the room it leaves (one round trip per lease, not two; a trainer does not: its
reply names the version to publish, which it publishes before it claims). A
:class:`~..actor.StreamingActor` (the generator) holds many leases at once; a plain actor
is one of capacity one whose ``advance`` is its ``process``. Before the actor sees a
lease its referenced payloads are fetched; its results' large payloads stay here,
referenced (data_plane.py); how each lease ends, completed or handed back, is leases.py;
what the worker hears on the bus, and its wait for work, is listening.py.
Beside the loop, a heartbeat thread renews the worker's leases and frees payloads nobody
refers to any more (heartbeats.py). A generator (an actor that overrides ``on_version``)
loads each published version between leases and reports it with LoadedVersion; a trainer
(``publishes_versions``) announces the version each step's reply (StepDone) names, with
the weight plane's manifest and address when ``on_publish`` returns them (what to load
and announce: version_tracking.py). An actor asks whom to fetch weights from with
``WorkerContext.ask_weights`` (WantWeights → WeightsPlan), on the main thread
(questions.py).

When to claim and for how much, whichever request carries the claim (a Claim, a
Complete, the report of a version just loaded), is claims.py's.

Resilience: every request is retried until answered, and a worker the scheduler forgot
registers again first (requests.py); a Lease that answered a lost try and comes late is
handed back (``late_reply``).

Each Complete says where the loop's wall time went since the previous one (the role's
work, waiting for work, the scheduler, payloads, weights: bus.TimeBucket, time_split.py)
and how many tokens the work covered; the scheduler turns these into per-role shares.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from asyncrl.runtime.contract.bus import TimeBucket
from asyncrl.runtime.contract.config import RunConfig, pipeline_for
from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import Pipeline
from asyncrl.transport import protocol as p
from asyncrl.transport.link import LinkClosed, LinkTimeout, SchedulerLink

from ..actor import Actor, ActorBroken, OneLeaseAtATime, StreamingActor, WorkerContext
from .claims import Claims
from .data_plane import WorkerPayloads, in_process_keys
from .heartbeats import Heartbeats
from .leases import MAX_REASON, Leases
from .listening import (
    CRITIC_PUBLISHED,
    CRITIC_WANTED,
    VERSION_PUBLISHED,
    VERSION_WANTED,
    WorkerEvents,
)
from .questions import SchedulerQuestions
from .requests import Fatal, GaveUp, Requests, is_error
from .time_split import TimeSplit
from .version_tracking import PolicyRolledBack, Versions
from .version_tracking import describe_reply as _describe

__all__ = ["Pacing", "Worker", "default_worker_name"]

log = structlog.get_logger("asyncrl.worker")

_BYE_S = 1.0  # the scheduler exits once the run's workers are gone; its reply may go with it


@dataclass(frozen=True, slots=True)
class Pacing:
    """How often a worker asks, and how long it waits; the defaults suit a real run."""

    poll_s: float = 0.5  # idle: claim again after this long without a wake-up event
    fetch_poll_s: float = 0.005  # idle while a newer version is fetched: look this often
    request_timeout_s: float = 5.0  # a request unanswered this long is sent again
    max_backoff_s: float = 5.0  # the longest pause between two tries
    stop_retry_s: float = 30.0  # how long a stopping worker retries handing back its lease
    version_check_s: float = 2.0  # events may drop: an idle generator asks this often


def default_worker_name(role: str) -> str:
    return f"{role}-{socket.gethostname()}-{os.getpid()}"


class Worker(SchedulerQuestions):
    """Runs one Actor on one link until the run ends or ``stop()`` is called."""

    def __init__(
        self,
        actor: Actor,
        link: SchedulerLink,
        config: RunConfig,
        *,
        name: str | None = None,
        pacing: Pacing = Pacing(),
        pipeline: Pipeline | None = None,
        clock: Callable[[], float] = time.monotonic,
        index: int | None = None,
        payloads: WorkerPayloads | None = None,
        on_started: Callable[[], None] | None = None,
        on_working: Callable[[], None] | None = None,
        local: bool = True,  # every process of the run is on this host (WorkerContext.local)
    ) -> None:
        self.actor, self.index, self.link, self.local = actor, index, link, local
        self.config = config
        self.role = actor.role
        self.name = name or default_worker_name(self.role)
        self.pacing = pacing
        self.pipeline = pipeline = pipeline or pipeline_for(config)
        self.clock = clock
        self._stop_requests = 0  # a plain counter: set from a signal handler
        self._ready: p.Ready | None = None
        self._log = log.bind(worker=self.name, role=self.role)
        self._time = TimeSplit()  # where the loop's time goes; each Complete carries it
        self._requests = Requests(
            self._request,
            request_timeout_s=pacing.request_timeout_s,
            max_backoff_s=pacing.max_backoff_s,
            stop_retry_s=pacing.stop_retry_s,
            clock=clock,
            time_split=self._time,
            log=self._log,
            stop_requests=lambda: self._stop_requests,
            register_again=self._register_again,
        )
        self._versions = Versions(
            actor,
            self.name,
            self._requests.call,
            self._status,
            clock,
            pacing.version_check_s,
            self._log,
            self._time,
            # An idle follower claims with the report of the version it loaded.
            claim_room=lambda: self._claims.room(),
            claimed=lambda reply: self._claims.with_report(reply),
        )
        self._main: threading.Thread | None = None  # the thread in run(): the link's caller
        # A later stage reads this role's results (the trainer's are the end of the line:
        # they go inline, and the scheduler drops them with the trained group).
        results_are_read = any(
            pipeline.consumers(stage.target) for stage in pipeline.for_role(self.role)
        )
        self.payloads = payloads or WorkerPayloads(
            self.name,
            host=config.payloads.host or "127.0.0.1",
            inline_bytes=config.payloads.inline_bytes,
            fetch_timeout_s=config.payloads.fetch_timeout_s,
            max_message_bytes=config.scheduler.max_message_mb << 20,
            keys=in_process_keys(),
            shared_memory=config.payloads.shared_memory,
        )
        self._events = WorkerEvents(
            self.name, pipeline, lambda: self.link, actor, self._versions, self.payloads, self._time
        )
        self._leases = Leases(
            self.name,
            self.payloads,
            self._requests.call,
            self._time,
            self._log,
            results_are_read=results_are_read,
        )
        self._claims = Claims(
            self._leases,
            clock,
            pacing.poll_s,
            publishes_versions=actor.publishes_versions,
            stopping=lambda: self._stopping,
        )
        self._heartbeats = Heartbeats(
            self.name,
            self._request,
            self.payloads,
            request_timeout_s=pacing.request_timeout_s,
            interval=self._heartbeat_interval,
            holding=lambda: self._leases.holding,
            log=self._log,
        )
        # Called once registered and the actor started: a supervisor tells a failure before
        # this point (it will recur) from a crash after it (runtime/contract/child_status.py).
        self._on_started = on_started
        # Called once, at the first lease completed (groups added, for a dataloader): a
        # failure before it, in the worker's own words, would recur at every start's first
        # lease (a training group whose update breaks), and is counted as one to start.
        self._on_working = on_working
        self.failure: str | None = None  # why run() returned non-zero, in one line

    # --- the public surface ----------------------------------------------------------

    def run(self) -> int:
        """Register, work until the run ends or ``stop()``, leave. Returns the exit code."""
        self._main = threading.current_thread()
        error: BaseException | None = None
        try:
            self._start()
            if self._on_started is not None:
                self._on_started()
            self._loop()
        except (Fatal, GaveUp, LinkClosed) as caught:
            error = caught
        finally:
            # A beat in flight to a gone scheduler is not awaited.
            self._heartbeats.stop(_BYE_S)
        return self._finish(error)

    def stop(self) -> None:
        """Finish the current lease, then leave. Safe from a signal handler; twice: hurry."""
        self._stop_requests += 1

    def late_reply(self, message: p.Message) -> None:
        """For the link: a reply that came after its request timed out.

        A Lease that came too late was retried as another claim, so nobody works on it:
        give it back now rather than hold its groups (heartbeats would keep renewing it).
        """
        if not isinstance(message, p.Lease):
            return
        self._log.warning("a lease came too late; giving it back", lease=message.lease_id)
        fail = p.Fail(self.name, message.lease_id, message.fence, None, "lease arrived too late")
        # If the worker is leaving, the lease ends with its registration anyway.
        with contextlib.suppress(GaveUp, LinkClosed):
            self._requests.retry(fail)

    # --- start and end ---------------------------------------------------------------

    def _start(self) -> None:
        self._events.subscribe()
        ready = self._register()
        # Beating from registration on: a slow on_start (a trainer loading its checkpoint)
        # must not look like a dead worker to the scheduler.
        self._heartbeats.start()
        try:
            self.actor.on_start(self._context(ready))
        except Exception as error:
            self._log.exception("the actor failed to start")
            raise Fatal(f"on_start failed: {type(error).__name__}: {error}") from error
        critic = self.actor.follows_critic  # the versions it loads or publishes: the critic's
        if self._versions.tracks:
            self.link.subscribe([CRITIC_PUBLISHED if critic else VERSION_PUBLISHED])
            self._versions.load_newest()
        if self.actor.publishes_versions:
            self.link.subscribe([CRITIC_WANTED if critic else VERSION_WANTED])
            self._versions.publish_trained()

    def _context(self, ready: p.Ready) -> WorkerContext:
        critic = self.actor.follows_critic  # its versions and steps are the critic's
        return WorkerContext(
            worker=self.name,
            role=self.role,
            config=self.config,
            run=ready.run,
            heartbeat_interval_s=ready.heartbeat_interval_s,
            lease_timeout_s=ready.lease_timeout_s,
            max_message_bytes=ready.max_message_bytes,
            policy_version=ready.critic_version if critic else ready.policy_version,
            index=self.index,
            ask_weights=self._ask_weights,
            steps_done=ready.critic_steps_done if critic else ready.steps_done,
            rewind=self._rewind,
            local=self.local,
        )

    def _register(self) -> p.Ready:
        reply = self._requests.retry(p.Hello(self.name, self.role, p.PROTOCOL_VERSION, os.getpid()))
        if isinstance(reply, p.Error):
            raise Fatal(f"the scheduler refused this worker ({reply.code}): {reply.detail}")
        if not isinstance(reply, p.Ready):
            raise Fatal(f"the scheduler answered Hello with {type(reply).__name__}")
        first = self._ready is None
        self._ready = reply
        self._log.info("registered" if first else "registered again", run=reply.run)
        try:
            self._versions.registered(reply, first)
        except PolicyRolledBack as error:
            raise Fatal(str(error)) from error
        return reply

    def _register_again(self) -> None:
        """The scheduler forgot this worker: Hello again, and the versions know it."""
        self._register()
        self._versions.must_announce = True

    def _heartbeat_interval(self) -> float:
        assert self._ready is not None
        return self._ready.heartbeat_interval_s

    def _request(self, message: p.Message, timeout_s: float) -> p.Message:
        # One try, on the link as it is now: ``link`` may be replaced after construction
        # (wrapped to record what is sent, say), and every request goes on the new one.
        return self.link.request(message, timeout_s)

    def _finish(self, error: BaseException | None) -> int:
        """Leave the scheduler, stop the actor; the exit code says whether it went well."""
        if self._ready is not None and not isinstance(error, LinkClosed):
            self._say_bye("stopped" if self._stopping else "failed" if error else "run over")
        self._stop_actor()
        self.payloads.close()  # what nobody read yet is made again by others
        if error is None or (self._stopping and not isinstance(error, Fatal)):
            self._log.info("worker done", leases=self._leases.settled)
            return 0
        # Fatal's own words say what failed; other errors need their type to make sense.
        fatal = isinstance(error, Fatal)
        self.failure = str(error) if fatal else f"{type(error).__name__}: {error}"
        self._log.error("worker failed", error=self.failure)
        return error.exit_code if isinstance(error, Fatal) else 1

    def _say_bye(self, reason: str) -> None:
        try:  # once, briefly: a scheduler that is gone has forgotten us already
            self.link.request(p.Bye(self.name, reason), min(self.pacing.request_timeout_s, _BYE_S))
        except (LinkTimeout, LinkClosed):
            self._log.info("leaving without a goodbye: the scheduler did not answer")

    def _stop_actor(self) -> None:
        if self._ready is None:
            return
        try:
            self.actor.on_stop()
        except Exception:
            self._log.exception("the actor failed to stop cleanly")

    @property
    def _stopping(self) -> bool:
        return self._stop_requests > 0

    # --- the loop --------------------------------------------------------------------

    def _loop(self) -> None:
        """Claim while there is room, advance between claims, complete leases as they end.

        A plain actor runs here too, as a streaming actor of capacity one whose ``advance``
        is its whole ``process`` (:class:`~..actor.OneLeaseAtATime`).
        """
        actor = (
            self.actor if isinstance(self.actor, StreamingActor) else OneLeaseAtATime(self.actor)
        )
        claims = self._claims
        claims.start(actor)
        self._time.start()
        while True:
            self._versions.announce_again_if_forgotten()
            if self._events.take(0):
                claims.woken()  # new work was announced
            if self._stop_requests > 1:
                self._leases.give_back(actor.abandon(), "the worker is stopping now")
                return
            if claims.due():
                reply = self._requests.call(p.Claim(self.name, self.role, actor.capacity()))
                if isinstance(reply, p.Lease):
                    self._leases.admit(actor, reply)
                    continue  # there may be room for more
                if isinstance(reply, p.Want) and reply.count > 0:
                    self._feed(reply.count)
                    continue
                if isinstance(reply, p.Shutdown):
                    # Work in flight now would only be refused: hand it back and leave.
                    self._log.info("the scheduler says the run is over", reason=reply.reason)
                    if reply.reason == p.RUN_FINISHED:
                        actor.on_run_over()
                    self._leases.give_back(actor.abandon(), f"shutdown: {reply.reason}")
                    claims.run_over = True
                elif is_error(reply, Reason.BAD_VERSION) and self._versions.loaded is not None:
                    self._versions.report_loaded()  # the scheduler lost what we loaded
                else:
                    if not isinstance(reply, p.NoWork | p.Want):
                        self._log.warning("claim not granted", reply=_describe(reply))
                    claims.found_nothing()
            if actor.busy:
                if self._advance(actor):
                    claims.found_nothing()  # the claim with its last Complete
            elif not claims.open and (self._stopping or not actor.lingers()):
                self._log.info("stopping" if self._stopping else "run over: leaving")
                return
            elif self._events.idle(self.pacing.poll_s, self.pacing.fetch_poll_s):
                claims.woken()

    def _advance(self, actor: StreamingActor) -> bool:
        """Advance the actor and end the leases it finished, each Complete asking for the
        work that fills the room it leaves. True if the last such ask found nothing: the
        scheduler wakes this worker when work comes, as after a claim that found none."""
        try:
            with self._time.spent_on(TimeBucket.COMPUTE):
                finished = actor.advance()
        except ActorBroken as error:
            reason = f"{type(error).__name__}: {error}"[:MAX_REASON]
            self._log.error("the actor cannot go on in this process", reason=reason)
            self._leases.give_back(actor.abandon(), reason)
            raise Fatal(reason) from error
        except Exception as error:
            reason = f"{type(error).__name__}: {error}"[:MAX_REASON]
            self._log.warning("work failed", reason=reason, exc_info=True)
            self._leases.give_back(actor.abandon(), reason)
            return False
        self._send_reports()
        found_nothing = False
        for lease, outcome in finished:
            claim_next = self._claims.room()
            taken = self._leases.finish(lease, outcome, claim_next)
            self._worked()
            if isinstance(taken, p.Lease):
                self._leases.admit(actor, taken)  # tracked as a Claim's: heartbeats, fence
            if outcome.results and claim_next:
                found_nothing = isinstance(taken, p.Ack)
            if not outcome.results or not self.actor.publishes_versions:
                continue
            if isinstance(taken, p.StepDone):
                self._versions.publish(taken.version)  # the reply says which: no Status
            elif taken is None:
                # The lease had ended: maybe an earlier try of this Complete was taken and
                # its reply lost. Only the scheduler's status says whether a step is due.
                self._versions.publish_trained()
        return found_nothing

    def _send_reports(self) -> None:
        for report in self.actor.take_reports():
            reply = self._requests.call(report)
            if not isinstance(reply, p.Ack):
                self._log.warning("report not taken", name=report.name, reply=_describe(reply))

    def _feed(self, wanted: int) -> None:
        try:
            with self._time.spent_on(TimeBucket.COMPUTE):
                groups = tuple(self.actor.feed(wanted))
        except Exception:
            self._log.exception("feed failed")
            groups = ()
        if not groups:
            self._idle()
            return
        reply = self._requests.call(p.AddGroups(self.name, groups))
        if isinstance(reply, p.Added):
            self._worked()
            self._log.debug("groups added", added=len(reply.added), skipped=len(reply.skipped))
        else:
            self._log.warning("groups not added", reply=_describe(reply))
            self._idle()

    def _worked(self) -> None:
        if self._on_working is not None:
            on_working, self._on_working = self._on_working, None
            on_working()

    def _idle(self) -> None:
        self._events.idle(self.pacing.poll_s, self.pacing.fetch_poll_s)
