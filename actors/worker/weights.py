"""A generator's side of the weight plane: ask for plans, fetch in the background, hand
over whole versions, and account for what each one cost the decode loop; and who any
worker's weight plane is open to (:func:`weights_access`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import structlog
import torch

from asyncrl.actors.actor import WorkerContext
from asyncrl.actors.worker.release import Releaser
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport.identity import load_run_secret
from asyncrl.transport.weights import (
    NeedsPlan,
    Received,
    WeightReceiver,
    WeightsAccess,
    WeightsPlan,
    weights_key,
)

__all__ = ["WeightFollower", "weights_access"]

log = structlog.get_logger("asyncrl.weights")

AskWeights = Callable[[int, bytes, str], "WeightsPlan | None"]
NEWEST = 0  # asked for as a version: whatever the scheduler holds newest

# After the scheduler had no plan, ask again no sooner than this (it answers each step's
# publication within milliseconds; a second is plenty and keeps the bus quiet).
RETRY_S = 1.0


class WeightFollower:
    """Keeps one fetch going towards the newest version; never blocks the caller."""

    def __init__(self, receiver: WeightReceiver, ask: AskWeights | None) -> None:
        self.receiver = receiver
        self.ask = ask
        self._retry_at = 0.0
        self._main_thread_s = 0.0  # the caller's time spent on the current version
        self._releaser = Releaser()

    def step(self, newest: int, loaded: int) -> Received | None:
        """Advance towards ``newest``; a version ready to load, if one is."""
        started = time.perf_counter()
        try:
            outcome = self.receiver.poll()
            if isinstance(outcome, Received):
                return outcome
            if isinstance(outcome, NeedsPlan):
                self._ask(outcome.version, outcome.failed)
            elif newest > loaded and self.receiver.target is None:
                self._ask(NEWEST, "")
            return None
        finally:
            self._main_thread_s += time.perf_counter() - started

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
        if plan is None:
            self._retry_at = now + RETRY_S
            return
        try:
            self.receiver.want(plan)
        except ValueError as error:  # a manifest this receiver cannot use
            log.warning("weight plan refused", version=plan.version, reason=str(error)[:200])
            self._retry_at = now + RETRY_S


def weights_access(ctx: WorkerContext) -> WeightsAccess:
    """Who this worker's weight plane is open to: this host only in a local run; and the
    run's key, from its secret where this user can read it (as every worker the launcher
    starts can). ValueError for a run across machines without it."""
    try:
        key = weights_key(load_run_secret(RunDir.of(ctx.config).secret))
    except (FileNotFoundError, PermissionError):
        key = None
    if key is None and ctx.local:
        log.warning(
            "no run secret here: weight requests go unauthenticated, and sources that "
            "hold the key refuse them"
        )
    return WeightsAccess(local=ctx.local, key=key)
