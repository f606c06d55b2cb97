"""A generator's side of the weight plane: ask for plans, fetch in the background, hand
over whole versions, and account for what each one cost the decode loop; and who any
worker's weight plane is open to (:func:`weights_access`).

A weight plane that cannot deliver says so: a follower that has loaded no version for
``weights.stall_warning_s`` while a newer one is published puts a line on its supervisor's
terminal naming itself, its source and why the source failed it; past
``weights.stall_stop_s`` it stops the run with that error (:class:`RunCannotGoOn`). It
does not restart itself: its fetches already dial their source afresh after each failure,
and what keeps every one of them from arriving (a transport that cannot reach the source)
would keep a new process's too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog
import torch

from asyncrl.actors.actor import RunCannotGoOn, WorkerContext
from asyncrl.actors.worker.release import Releaser
from asyncrl.runtime.contract.child_status import note_warning
from asyncrl.runtime.contract.config import RunConfig, WeightsSection
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport.identity import load_run_secret
from asyncrl.transport.weights import (
    NeedsPlan,
    Received,
    WeightReceiver,
    WeightsAccess,
    WeightsPlan,
    weights_key,
)

__all__ = ["StallBounds", "WeightFollower", "weights_access", "weights_access_for"]

log = structlog.get_logger("asyncrl.weights")

AskWeights = Callable[[int, bytes, str], "WeightsPlan | None"]
NEWEST = 0  # asked for as a version: whatever the scheduler holds newest

# After the scheduler had no plan, ask again no sooner than this (it answers each step's
# publication within milliseconds; a second is plenty and keeps the bus quiet).
RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class StallBounds:
    """How long ``worker`` may go without a new version before it says so, and stops."""

    worker: str
    warning_s: float
    stop_s: float

    @classmethod
    def of(cls, worker: str, weights: WeightsSection) -> StallBounds:
        return cls(worker, weights.stall_warning_s, weights.stall_stop_s)


class WeightFollower:
    """Keeps one fetch going towards the newest version; never blocks the caller."""

    def __init__(
        self, receiver: WeightReceiver, ask: AskWeights | None, stall: StallBounds | None = None
    ) -> None:
        self.receiver = receiver
        self.ask = ask
        self.stall = stall
        self._retry_at = 0.0
        self._main_thread_s = 0.0  # the caller's time spent on the current version
        self._releaser = Releaser()
        self._waiting: tuple[int, float] | None = None  # (loaded, since when) while behind
        self._warned = False
        self._source = "no source yet"  # whom the newest plan named
        self._failed = ""  # the source that failed the last fetch, if one did
        self._failure = ""  # why the last fetch failed, as its receiver said
        self._no_plan = False  # the scheduler named no source when last asked

    def step(self, newest: int, loaded: int) -> Received | None:
        """Advance towards ``newest``; a version ready to load, if one is.

        Raises :class:`RunCannotGoOn` once no version has come for ``stall.stop_s``
        while a newer one than ``loaded`` is published."""
        started = time.perf_counter()
        try:
            outcome = self.receiver.poll()
            if isinstance(outcome, Received):
                return outcome
            if isinstance(outcome, NeedsPlan):
                self._failed, self._failure = outcome.failed, outcome.reason
                self._ask(outcome.version, outcome.failed)
            elif newest > loaded and self.receiver.target is None:
                self._ask(NEWEST, "")
            self._check_stall(newest, loaded)
            return None
        finally:
            self._main_thread_s += time.perf_counter() - started

    def _why(self) -> str:
        no_plan = "the scheduler names no source for it" if self._no_plan else ""
        now_from = f"now asking {self._source}" if self._source != self._ends() else ""
        why = "; ".join(x for x in (self._failure, no_plan, now_from) if x)
        return why or "its fetch is under way"

    def _ends(self) -> str:
        """The source to name: the one that failed the last fetch, else the one asked."""
        return self._failed or self._source

    def _check_stall(self, newest: int, loaded: int) -> None:
        if self.stall is None or newest <= loaded:
            self._waiting, self._warned = None, False
            return
        now = time.monotonic()
        if self._waiting is None or self._waiting[0] != loaded:  # behind since now
            self._waiting, self._warned = (loaded, now), False
        waited = now - self._waiting[1]
        s = self.stall
        if waited >= s.stop_s:
            raise RunCannotGoOn(
                f"weights stalled: {s.worker} got no version from {self._ends()} in "
                f"{s.stop_s:g} s (weights.stall_stop_s) while version {newest} is published "
                f"and it runs version {loaded}: {self._why()}"
            )
        if waited >= s.warning_s and not self._warned:
            self._warned = True
            line = (
                f"no weights reach {s.worker} from {self._ends()}: version {newest} is "
                f"published, it runs version {loaded} after {waited:.0f} s: {self._why()} (the "
                f"run stops at weights.stall_stop_s={s.stop_s:g})"
            )
            log.warning(line, source=self._ends())
            note_warning(line)

    def follow(
        self, newest: int, loaded: int, load: Callable[[Received], Iterable[torch.Tensor]]
    ) -> tuple[int, dict[str, object]] | None:
        """Advance towards ``newest``; a version that is ready goes into the model with
        ``load`` (which returns the tensors the model ran on before): that version and
        what moving it cost (for the weights report), or None if none was ready."""
        received = self.step(newest, loaded)
        if received is None:
            return None
        started = time.perf_counter()
        superseded = load(received)
        return received.version, self.loaded(received, time.perf_counter() - started, superseded)

    def loaded(
        self, received: Received, load_s: float, superseded: Iterable[torch.Tensor] = ()
    ) -> dict[str, object]:
        """The model runs on ``received`` and no longer on ``superseded`` (freed in the
        background); what moving it cost (for the weights report)."""
        self._releaser.release(superseded)
        self.receiver.loaded(received)
        stall_s, self._main_thread_s = self._main_thread_s + load_s, 0.0
        return {
            "transfer_s": round(received.transfer_s, 6),
            "load_s": round(load_s, 6),
            "stall_s": round(stall_s, 6),
            "bytes": received.nbytes,
            "mb_per_s": round(received.nbytes / max(received.transfer_s, 1e-9) / 1e6, 1),
            "source": received.source,
            "attempts": received.attempts,
            "retried_buckets": received.retried_buckets,
        }

    def _ask(self, version: int, failed: str) -> None:
        now = time.monotonic()
        if self.ask is None or (not failed and now < self._retry_at):
            return
        plan = self.ask(version, self.receiver.address, failed)
        if plan is None and version != NEWEST:  # that version is gone: take the newest
            plan = self.ask(NEWEST, self.receiver.address, failed)
        self._no_plan = plan is None
        if plan is None:
            self._retry_at = now + RETRY_S
            return
        self._source = plan.source
        try:
            self.receiver.want(plan)
        except ValueError as error:  # a manifest this receiver cannot use
            log.warning("weight plan refused", version=plan.version, reason=str(error)[:200])
            self._retry_at = now + RETRY_S


def weights_access(ctx: WorkerContext) -> WeightsAccess:
    """Who this worker's weight plane is open to: this host only in a local run; and the
    run's key, from its secret where this user can read it (as every worker the launcher
    starts can). ValueError for a run across machines without it."""
    return weights_access_for(ctx.config, ctx.local)


def weights_access_for(config: RunConfig, local: bool) -> WeightsAccess:
    """:func:`weights_access` for a process with no context of its own (a group's rank
    past 0, told by its leader whether the run is ``local``)."""
    try:
        key = weights_key(load_run_secret(RunDir.of(config).secret))
    except (FileNotFoundError, PermissionError):
        key = None
    if key is None and local:
        log.warning(
            "no run secret here: weight requests go unauthenticated, and sources that "
            "hold the key refuse them"
        )
    return WeightsAccess(local=local, key=key)
