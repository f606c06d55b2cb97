"""The ``logp`` role: proximal log-probs of generated responses under recent weights.

Consumes ``transition.*.generated``; produces :class:`LogprobsOut` with the version it
used. These are the "proximal" policy of the decoupled PPO objective: the trainer clips
its ratio against them, and weighs by how far the behaviour policy (the generator's)
was from them. It loads each published version, like a generator.
"""

from __future__ import annotations

from typing import ClassVar

from asyncrl.runtime.core.pipeline import Role

from ._scorer import ScoringActor
from ._setup import load_version, weight_sync
from .actor import WorkerContext

__all__ = ["Logp"]


class Logp(ScoringActor):
    role: ClassVar[str] = Role.LOGP.value

    def __init__(self) -> None:
        self.loaded = 0

    def on_start(self, ctx: WorkerContext) -> None:
        super().on_start(ctx)
        self.sync = weight_sync(ctx.config)

    @property
    def version(self) -> int | None:
        return self.loaded

    def on_version(self, version: int) -> int | None:
        if version > self.loaded and load_version(self.model, self.sync, version) is not None:
            self.loaded = version
        return self.loaded
