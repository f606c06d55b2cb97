"""The ``logp`` role: proximal log-probs of generated responses under recent weights.

Consumes ``transition.*.generated``; produces :class:`LogprobsOut` with the version it
used. These are the "proximal" policy of the decoupled PPO objective: the trainer clips
its ratio against them, and weighs by how far the behaviour policy (the generator's)
was from them. It loads each published version, like a generator.
"""

from __future__ import annotations

from typing import ClassVar

from asyncrl.runtime.core.pipeline import Role
from asyncrl.transport import protocol as p

from ._scorer import score_items
from ._scorer import tokens_of as _tokens
from ._setup import load_policy, load_version, weight_sync
from .payloads import LogprobsOut
from .worker import Actor, Outcome, WorkerContext

__all__ = ["Logp"]


class Logp(Actor):
    role: ClassVar[str] = Role.LOGP.value
    claim_size: ClassVar[int] = 4

    def __init__(self) -> None:
        self.loaded = 0

    def on_start(self, ctx: WorkerContext) -> None:
        self.cfg = ctx.config
        self.model, self.codec = load_policy(ctx.config, self.role)
        self.sync = weight_sync(ctx.config)

    def on_version(self, version: int) -> int | None:
        if version > self.loaded and load_version(self.model, self.sync, version) is not None:
            self.loaded = version
        return self.loaded

    def process(self, lease: p.Lease) -> Outcome:
        temperature = self.cfg.algorithm.temperature
        scores = score_items(self.model, lease.items, self.codec.pad_id, temperature)
        return Outcome(
            tuple(
                p.Result(item.gid, LogprobsOut(score, self.loaded).to_payload())
                for item, score in zip(lease.items, scores, strict=True)
            ),
            tokens=_tokens(lease),
        )
