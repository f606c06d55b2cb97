"""The ``logp`` role: proximal log-probs of generated responses under recent weights.

Consumes ``transition.*.generated``; produces :class:`LogprobsOut` with the version it
used. These are the "proximal" policy of the decoupled PPO objective: the trainer clips
its ratio against them, and weighs by how far the behaviour policy (the generator's)
was from them. It loads each published version, like a generator.
"""

from __future__ import annotations

import time
from typing import ClassVar

from asyncrl.runtime.core.pipeline import Role
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import make_receiver

from ._scorer import ScoringActor
from ._weights import WeightFollower
from .actor import WorkerContext
from .policy.checkpoint import load_state

__all__ = ["Logp"]


class Logp(ScoringActor):
    role: ClassVar[str] = Role.LOGP.value

    def __init__(self) -> None:
        self.loaded = 0
        self.reports: list[p.Report] = []

    def on_start(self, ctx: WorkerContext) -> None:
        super().on_start(ctx)
        self.worker = ctx.worker
        cfg = ctx.config
        receiver = make_receiver(cfg.weights, RunDir.of(cfg).weight_dirs(cfg.weights))
        self.weights = WeightFollower(receiver, ctx.ask_weights)

    @property
    def version(self) -> int | None:
        return self.loaded

    def on_version(self, version: int) -> int | None:
        received = self.weights.step(version, self.loaded)
        if received is not None:
            started = time.perf_counter()
            superseded = load_state(self.model, received.state, copy=False)  # no copy
            cost = self.weights.loaded(received, time.perf_counter() - started, superseded)
            self.loaded = received.version
            self.reports.append(p.Report(self.worker, "weights", self.loaded, cost))
        return self.loaded

    def take_reports(self) -> list[p.Report]:
        reports, self.reports = self.reports, []
        return reports

    def on_stop(self) -> None:
        self.weights.receiver.close()
