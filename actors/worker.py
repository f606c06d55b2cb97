"""The worker: one role's code (an :class:`Actor`) driven over one SchedulerLink.

A role subclasses :class:`~.actor.Actor` and fills in hooks; :class:`Worker` does the
talking. Role code never sees a socket, a retry or a heartbeat. The loop::

    Hello → Ready                      register (a protocol mismatch is fatal: exit 1)
    Claim(n) → Lease  → process        → Complete (or Fail if process raised)
             → NoWork                  wait for a wake-up event, or poll_s, then claim again
             → Want(k) → feed(k)       → AddGroups (the dataloader)
             → Shutdown                → Bye, exit 0

One loop serves every actor: it claims while the actor has room, ``advance``s in between,
and completes each lease as soon as it is done. A :class:`~.actor.StreamingActor` (the
generator) holds many leases at once; a plain actor is one of capacity one whose
``advance`` is its ``process``. Before the actor sees a lease its referenced payloads are
fetched; its results' large payloads stay here, referenced (_payloads.py). Beside the
loop, a heartbeat thread renews the worker's leases and frees payloads nobody refers to
any more. A generator (an actor that overrides ``on_version``) loads each published
version between leases and reports it with LoadedVersion; a trainer
(``publishes_versions``) announces the version each step's reply (StepDone) names, with
the weight plane's manifest and address when ``on_publish`` returns them (what to load
and announce: _versions.py). An actor asks whom to fetch weights from with
``WorkerContext.ask_weights`` (WantWeights → WeightsPlan), on the main thread.

Resilience: every request is retried on LinkTimeout with capped backoff (the scheduler may
be restarting), so a Complete whose reply was lost is sent again with the same lease and
fence, and the scheduler either takes it or says the lease ended. A scheduler that forgot
the worker (``unknown_worker``) gets a new Hello, then the request again.

Each Complete says where the loop's wall time went since the previous one (the role's
work, waiting for work, the scheduler, payloads, weights: bus.TimeBucket, _time_split.py)
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
from typing import Any

import structlog

from asyncrl.runtime.bus import ACTIVITY_KEY, TimeBucket, finished_topics, wakeup_topics
from asyncrl.runtime.config import RunConfig, pipeline_for
from asyncrl.runtime.core.effects import Reason
from asyncrl.runtime.core.pipeline import Pipeline
from asyncrl.transport import protocol as p
from asyncrl.transport.link import LinkClosed, LinkTimeout, SchedulerLink
from asyncrl.transport.topics import Topic, topic

from ._payloads import LostPayloads, WorkerPayloads
from ._time_split import TimeSplit
from ._versions import PolicyRolledBack, Versions
from ._versions import describe_reply as _describe
from .actor import Actor, ActorBroken, OneLeaseAtATime, Outcome, StreamingActor, WorkerContext

__all__ = ["Pacing", "Worker", "default_worker_name"]

log = structlog.get_logger("asyncrl.worker")

VERSION_PUBLISHED = topic(Topic.VERSION, "published")
_LEASE_ENDED = frozenset({Reason.STALE_FENCE, Reason.UNKNOWN_LEASE})
_FIRST_BACKOFF_S = 0.05
_BYE_S = 1.0  # the scheduler exits once the run's workers are gone; its reply may go with it
_MAX_REASON = 500  # characters of an exception kept in a Fail's reason


@dataclass(frozen=True, slots=True)
class Pacing:
    """How often a worker asks, and how long it waits; the defaults suit a real run."""

    poll_s: float = 0.5  # idle: claim again after this long without a wake-up event
    fetch_poll_s: float = 0.005  # idle while a newer version is fetched: look this often
    request_timeout_s: float = 5.0  # a request unanswered this long is sent again
    max_backoff_s: float = 5.0  # the longest pause between two tries
    stop_retry_s: float = 30.0  # how long a stopping worker retries handing back its lease
    version_check_s: float = 2.0  # events may drop: an idle generator asks this often


class _Fatal(Exception):
    """The worker cannot go on (refused registration, an actor that fails to start)."""


class _GaveUp(Exception):
    """A request was abandoned because the worker is stopping."""


def default_worker_name(role: str) -> str:
    return f"{role}-{socket.gethostname()}-{os.getpid()}"


class Worker:
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
    ) -> None:
        self.actor = actor
        self.index = index
        self.link = link
        self.config = config
        self.role = actor.role
        self.name = name or default_worker_name(self.role)
        self.pacing = pacing
        self.pipeline = pipeline = pipeline or pipeline_for(config)
        self.clock = clock
        self._stop_requests = 0  # a plain counter: set from a signal handler
        self._done = threading.Event()  # the main loop has ended: the heartbeat thread ends
        self._ready: p.Ready | None = None
        self._log = log.bind(worker=self.name, role=self.role)
        self._time = TimeSplit()  # where the loop's time goes; each Complete carries it
        self._versions = Versions(
            actor,
            self.name,
            self._call,
            self._status,
            clock,
            pacing.version_check_s,
            self._log,
            self._time,
        )
        self._settled = 0  # leases completed or failed, as the scheduler took them
        # The lease being worked on: heartbeats renew only it, so a lease whose reply never
        # reached this worker runs out instead of being kept alive.
        self._holding: tuple[int, ...] = ()
        self._running: dict[int, p.Lease] = {}  # a streaming actor's leases, by id
        self._main: threading.Thread | None = None  # the thread in run(): the link's caller
        self._wakeups: tuple[str, ...] = ()  # topic prefixes that may mean work (set at start)
        # A later stage reads this role's results (the trainer's are the end of the line:
        # they go inline, and the scheduler drops them with the trained group).
        self._results_are_read = any(
            pipeline.consumers(stage.target) for stage in pipeline.for_role(self.role)
        )
        self._finished: frozenset[str] = frozenset()  # topics of groups leaving the pipeline
        self.payloads = payloads or WorkerPayloads(
            self.name,
            host=config.payloads.host or "127.0.0.1",
            inline_bytes=config.payloads.inline_bytes,
            fetch_timeout_s=config.payloads.fetch_timeout_s,
            max_message_bytes=config.scheduler.max_message_mb << 20,
            shared_memory=config.payloads.shared_memory,
        )
        self._beats: threading.Thread | None = None
        # Called once registered and the actor started: a supervisor tells a failure before
        # this point (it will recur) from a crash after it (runtime/launch/child_status.py).
        self._on_started = on_started
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
        except (_Fatal, _GaveUp, LinkClosed) as caught:
            error = caught
        finally:
            self._done.set()
            if self._beats is not None:  # a beat in flight to a gone scheduler is not awaited
                self._beats.join(_BYE_S)
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
        with contextlib.suppress(_GaveUp, LinkClosed):
            self._retry(fail)

    # --- start and end ---------------------------------------------------------------

    def _start(self) -> None:
        self._wakeups = tuple(wakeup_topics(self.role, self.pipeline))
        self._finished = frozenset(finished_topics(self.pipeline))
        self.link.subscribe([*self._wakeups, *self._finished])
        ready = self._register()
        # Beating from registration on: a slow on_start (a trainer loading its checkpoint)
        # must not look like a dead worker to the scheduler.
        self._beats = threading.Thread(target=self._heartbeats, name=f"{self.name}-heartbeat")
        self._beats.daemon = True
        self._beats.start()
        try:
            self.actor.on_start(self._context(ready))
        except Exception as error:
            self._log.exception("the actor failed to start")
            raise _Fatal(f"on_start failed: {type(error).__name__}: {error}") from error
        if self._versions.tracks:
            self.link.subscribe([VERSION_PUBLISHED])
            self._versions.load_newest()
        if self.actor.publishes_versions:
            self._versions.publish_trained()

    def _context(self, ready: p.Ready) -> WorkerContext:
        return WorkerContext(
            worker=self.name,
            role=self.role,
            config=self.config,
            run=ready.run,
            heartbeat_interval_s=ready.heartbeat_interval_s,
            lease_timeout_s=ready.lease_timeout_s,
            max_message_bytes=ready.max_message_bytes,
            policy_version=ready.policy_version,
            index=self.index,
            ask_weights=self._ask_weights,
            steps_done=ready.steps_done,
            rewind=self._rewind,
        )

    def _register(self) -> p.Ready:
        reply = self._retry(p.Hello(self.name, self.role, p.PROTOCOL_VERSION, os.getpid()))
        if isinstance(reply, p.Error):
            raise _Fatal(f"the scheduler refused this worker ({reply.code}): {reply.detail}")
        if not isinstance(reply, p.Ready):
            raise _Fatal(f"the scheduler answered Hello with {type(reply).__name__}")
        first = self._ready is None
        self._ready = reply
        self._log.info("registered" if first else "registered again", run=reply.run)
        try:
            self._versions.registered(reply, first)
        except PolicyRolledBack as error:
            raise _Fatal(str(error)) from error
        return reply

    def _finish(self, error: BaseException | None) -> int:
        """Leave the scheduler, stop the actor; the exit code says whether it went well."""
        if self._ready is not None and not isinstance(error, LinkClosed):
            self._say_bye("stopped" if self._stopping else "failed" if error else "run over")
        self._stop_actor()
        self.payloads.close()  # what nobody read yet is made again by others
        if error is None or (self._stopping and not isinstance(error, _Fatal)):
            self._log.info("worker done", leases=self._settled)
            return 0
        # _Fatal's own words say what failed; other errors need their type to make sense.
        fatal = isinstance(error, _Fatal)
        self.failure = str(error) if fatal else f"{type(error).__name__}: {error}"
        self._log.error("worker failed", error=self.failure)
        return 1

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
        is its whole ``process`` (:class:`~.actor.OneLeaseAtATime`).
        """
        actor = (
            self.actor if isinstance(self.actor, StreamingActor) else OneLeaseAtATime(self.actor)
        )
        claim_again_at, run_over = 0.0, False
        self._time.start()
        while True:
            self._versions.announce_again_if_forgotten()
            if self._take_events(0):
                claim_again_at = 0.0  # new work was announced
            if self._stop_requests > 1:
                self._give_back(actor.abandon(), "the worker is stopping now")
                return
            open_for_work = not (self._stopping or run_over)
            if open_for_work and self.clock() >= claim_again_at and actor.capacity() > 0:
                reply = self._call(p.Claim(self.name, self.role, actor.capacity()))
                if isinstance(reply, p.Lease):
                    self._admit(actor, reply)
                    continue  # there may be room for more
                if isinstance(reply, p.Want) and reply.count > 0:
                    self._feed(reply.count)
                    continue
                if isinstance(reply, p.Shutdown):
                    # Work in flight now would only be refused: hand it back and leave.
                    self._log.info("the scheduler says the run is over", reason=reply.reason)
                    self._give_back(actor.abandon(), f"shutdown: {reply.reason}")
                    run_over = True
                elif _is_error(reply, Reason.BAD_VERSION) and self._versions.loaded is not None:
                    self._versions.report_loaded()  # the scheduler lost what we loaded
                else:
                    if not isinstance(reply, p.NoWork | p.Want):
                        self._log.warning("claim not granted", reply=_describe(reply))
                    claim_again_at = self.clock() + self.pacing.poll_s
            if actor.busy:
                self._advance(actor)
            elif not open_for_work:
                self._log.info("stopping" if self._stopping else "run over: leaving")
                return
            elif self._idle():
                claim_again_at = 0.0

    def _admit(self, actor: StreamingActor, lease: p.Lease) -> None:
        """Hand ``lease`` to the actor once what it references is fetched."""
        self._holding = (*self._running, lease.lease_id)
        resolved = self._resolved(lease)
        if resolved is not None:
            with self._time.spent_on(TimeBucket.COMPUTE):
                actor.admit(resolved)
            self._running[resolved.lease_id] = resolved
        self._holding = tuple(self._running)

    def _advance(self, actor: StreamingActor) -> None:
        try:
            with self._time.spent_on(TimeBucket.COMPUTE):
                finished = actor.advance()
        except ActorBroken as error:
            reason = f"{type(error).__name__}: {error}"[:_MAX_REASON]
            self._log.error("the actor cannot go on in this process", reason=reason)
            self._give_back(actor.abandon(), reason)
            raise _Fatal(reason) from error
        except Exception as error:
            reason = f"{type(error).__name__}: {error}"[:_MAX_REASON]
            self._log.warning("work failed", reason=reason, exc_info=True)
            self._give_back(actor.abandon(), reason)
            return
        self._send_reports()
        for lease, outcome in finished:
            self._running.pop(lease.lease_id, None)
            for gid, reason in outcome.failed:
                self._log.warning("group failed", lease=lease.lease_id, gid=gid, reason=reason)
                fail = p.Fail(self.name, lease.lease_id, lease.fence, (gid,), reason[:_MAX_REASON])
                with contextlib.suppress(_GaveUp, LinkClosed):
                    self._settle(fail)
            if not outcome.results:
                self._holding = tuple(self._running)
                continue
            taken = self._complete(lease, outcome)  # held, so renewed, until answered
            self._holding = tuple(self._running)
            if not self.actor.publishes_versions:
                continue
            if isinstance(taken, p.StepDone):
                self._versions.publish(taken.version)  # the reply says which: no Status
            elif taken is None:
                # The lease had ended: maybe an earlier try of this Complete was taken and
                # its reply lost. Only the scheduler's status says whether a step is due.
                self._versions.publish_trained()

    def _complete(self, lease: p.Lease, outcome: Outcome) -> p.Ack | p.StepDone | None:
        """Send ``outcome``'s Complete, large payloads kept here and referenced; the
        scheduler's reply once it took it, else None."""
        results, kept = outcome.results, ()
        if self._results_are_read:
            with self._time.spent_on(TimeBucket.PAYLOADS):
                results, kept = self.payloads.stash(outcome.results)
        # The time up to here; sending this Complete counts towards the next one.
        spent = [round(s * 1e6) for s in self._time.take()]
        activity = {"tokens": outcome.tokens, "us": spent}
        metrics = {**(outcome.metrics or {}), ACTIVITY_KEY: activity}
        message = p.Complete(
            self.name, lease.lease_id, lease.fence, results, metrics, outcome.durable_step
        )
        try:
            return self._settle(message)
        finally:
            # Taken or not, the scheduler's answers to Held free what it does not refer to.
            self.payloads.settled(kept)

    def _send_reports(self) -> None:
        for report in self.actor.take_reports():
            reply = self._call(report)
            if not isinstance(reply, p.Ack):
                self._log.warning("report not taken", name=report.name, reply=_describe(reply))

    def _give_back(self, leases: list[p.Lease], reason: str) -> None:
        for lease in leases:
            self._running.pop(lease.lease_id, None)
            with contextlib.suppress(_GaveUp, LinkClosed):
                self._settle(p.Fail(self.name, lease.lease_id, lease.fence, None, reason))
        self._holding = tuple(self._running)

    def _resolved(self, lease: p.Lease) -> p.Lease | None:
        """``lease`` with the payloads it references fetched; None if some could not be,
        in which case the lease was given back naming them, for their makers to redo."""
        try:
            with self._time.spent_on(TimeBucket.PAYLOADS):
                return self.payloads.resolve(lease)
        except LostPayloads as missing:
            reason = str(missing)[:_MAX_REASON]
            self._log.warning("payloads unavailable", lease=lease.lease_id, reason=reason)
            fail = p.Fail(self.name, lease.lease_id, lease.fence, None, reason, missing.lost)
            with contextlib.suppress(_GaveUp, LinkClosed):
                self._settle(fail)
            return None

    def _settle(self, message: p.Complete | p.Fail) -> p.Ack | p.StepDone | None:
        """Send a lease's end; the scheduler's reply once it took it, else None."""
        reply = self._call(message)
        if isinstance(reply, p.Ack | p.StepDone):
            self._settled += 1
            return reply
        if isinstance(reply, p.Error) and reply.code in _LEASE_ENDED:
            self._log.warning("result dropped: lease ended", lease=message.lease_id)
            return None
        self._log.error("result refused", lease=message.lease_id, reply=_describe(reply))
        if isinstance(message, p.Complete):
            # Give the groups back now: heartbeats would otherwise keep the lease alive.
            reason = f"result refused: {_describe(reply)}"[:_MAX_REASON]
            self._settle(p.Fail(self.name, message.lease_id, message.fence, None, reason))
        return None

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
        reply = self._call(p.AddGroups(self.name, groups))
        if isinstance(reply, p.Added):
            self._log.debug("groups added", added=len(reply.added), skipped=len(reply.skipped))
        else:
            self._log.warning("groups not added", reply=_describe(reply))
            self._idle()

    def _idle(self) -> bool:
        """Nothing to do now: wait for a wake-up (or the slow poll). True if woken."""
        # A version being fetched in the background says nothing when it is ready: look
        # again soon, or an idle generator would start on it only at the next event.
        wait_s = self.pacing.fetch_poll_s if self._versions.behind else self.pacing.poll_s
        with self._time.spent_on(TimeBucket.WAITING_FOR_WORK):
            woken = self._take_events(wait_s)
            self._versions.check_if_due()
        return woken

    def _take_events(self, timeout_s: float) -> bool:
        """Drain the events that came (waiting up to ``timeout_s`` for the first).

        True if one announced work (anything but a version), or a new version was loaded
        (work the staleness bound held back may be admitted under it).
        """
        woken = False
        event = self.link.next_event(timeout_s)
        while event is not None:
            if event.topic == VERSION_PUBLISHED:
                self._versions.heard_of(event.body.get("version"))
            elif event.topic.startswith(self._wakeups):
                woken = True
            if event.topic in self._finished:
                with self._time.spent_on(TimeBucket.PAYLOADS):
                    self.payloads.finished(event.body.get("groups", ()))
            event = self.link.next_event(0)
        return self._versions.load_newest() or woken

    # --- what the actor and the versions ask the scheduler ---------------------------

    def _ask_weights(self, version: int, address: bytes, failed: str) -> p.WeightsPlan | None:
        """WorkerContext.ask_weights: the scheduler's plan for fetching ``version``."""
        if threading.current_thread() is not self._main:
            raise RuntimeError("ask_weights is for the worker's main thread only")
        reply = self._call(p.WantWeights(self.name, version, address, failed))
        if isinstance(reply, p.WeightsPlan):
            return reply
        self._log.info("no weights plan", version=version, reply=_describe(reply))
        return None

    def _rewind(self, step: int) -> None:
        """WorkerContext.rewind: roll the run back to the trainer's ``step``."""
        if threading.current_thread() is not self._main:
            raise RuntimeError("rewind is for the worker's main thread only")
        reply = self._call(p.Rewind(self.name, step))
        if not isinstance(reply, p.Ack):
            raise RuntimeError(
                f"the scheduler refused to roll back to step {step}: {_describe(reply)}"
            )
        self._log.warning("training rolled back", step=step)

    def _status(self) -> dict[str, Any] | None:
        reply = self._retry(p.Status())
        if isinstance(reply, p.StatusReply):
            return reply.summary
        self._log.warning("status not answered", reply=_describe(reply))
        return None

    # --- requests --------------------------------------------------------------------

    def _call(self, message: p.Message, *, reregister: bool = True) -> p.Message:
        """The reply to ``message``; registers again first if the scheduler forgot us.

        Refused as not this connection's (the name went to another connection while this
        one was silent): registering again takes it back, or fails with the reason (a
        Hello refused is fatal); refused once more after that, retrying cannot help.
        """
        refused_sender = False
        while True:
            reply = self._retry(message)
            if not reregister:
                return reply
            if isinstance(reply, p.Error) and reply.code == Reason.WRONG_SENDER:
                if refused_sender:
                    raise _Fatal(f"the scheduler refused this worker: {reply.detail}")
                refused_sender = True
            elif not _is_error(reply, Reason.UNKNOWN_WORKER):
                return reply
            self._log.warning("the scheduler does not know this worker; registering again")
            self._register()
            self._versions.registered_again = True

    def _retry(self, message: p.Message) -> p.Message:
        """Send until a reply comes, backing off; a stopping worker gives up in time.

        The time until the reply is the scheduler's (waits after timeouts included), but
        for a claim that found nothing: that is waiting for work.
        """
        with self._time.spent_on(TimeBucket.SCHEDULER) as span:
            reply = self._send_until_answered(message)
            if _found_nothing(message, reply):
                span.charge_to(TimeBucket.WAITING_FOR_WORK)
            return reply

    def _send_until_answered(self, message: p.Message) -> p.Message:
        started, delay = self.clock(), _FIRST_BACKOFF_S
        while True:
            try:
                return self.link.request(message, self.pacing.request_timeout_s)
            except LinkTimeout:
                if self._should_give_up(message, started):
                    raise _GaveUp(f"{type(message).__name__}: no reply while stopping") from None
                name = type(message).__name__
                self._log.warning("no reply from the scheduler; retrying", request=name, in_s=delay)
                time.sleep(delay)
                delay = min(delay * 2, self.pacing.max_backoff_s)

    def _should_give_up(self, message: p.Message, started: float) -> bool:
        """A stopping worker retries only to end a lease it holds, and only for a while."""
        if not self._stopping:
            return False
        if self._stop_requests > 1 or not isinstance(message, p.Complete | p.Fail):
            return True
        return self.clock() - started >= self.pacing.stop_retry_s

    # --- heartbeats ------------------------------------------------------------------

    def _heartbeats(self) -> None:
        while not self._done.wait(self._heartbeat_interval()):
            self._beat()

    def _heartbeat_interval(self) -> float:
        assert self._ready is not None
        return self._ready.heartbeat_interval_s

    def _beat(self) -> None:
        # One try each: the next beat is the retry. The timeout is the long one: a link may
        # reconnect after a timeout, which could cost the main loop's reply in flight.
        # Registering again is the main loop's job (a forgotten worker's leases are gone
        # anyway), so two threads never race it.
        try:
            beat = p.Heartbeat(self.name, self._holding)
            reply = self.link.request(beat, self.pacing.request_timeout_s)
        except (LinkTimeout, LinkClosed):
            return
        if isinstance(reply, p.Error):
            self._log.warning("heartbeat refused", reply=_describe(reply))
            return
        self._free_payloads()

    def _free_payloads(self) -> None:
        """Ask which kept payloads the scheduler no longer refers to, and free them."""
        held = self.payloads.held(self.name)
        if held is None:
            return
        try:
            reply = self.link.request(held, self.pacing.request_timeout_s)
        except (LinkTimeout, LinkClosed):
            return
        if isinstance(reply, p.Drop):
            self.payloads.drop(reply.keys)


def _is_error(reply: p.Message, code: str) -> bool:
    return isinstance(reply, p.Error) and reply.code == code


def _found_nothing(message: p.Message, reply: p.Message) -> bool:
    """A claim answered with no work (a dataloader's: wanted nothing)."""
    if not isinstance(message, p.Claim):
        return False
    return isinstance(reply, p.NoWork) or (isinstance(reply, p.Want) and reply.count <= 0)
