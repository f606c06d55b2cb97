"""The ``ref_logp`` role: log-probs of generated responses under the frozen reference model.

Consumes ``transition.*.generated``; produces :class:`LogprobsOut` (version None). The
reference is the base model (``model.path``) and never changes; the trainer's optional
KL penalty (``algorithm.kl_coef``) keeps the policy near it.
"""

from __future__ import annotations

from typing import ClassVar

from asyncrl.runtime.core.pipeline import Role
from asyncrl.transport import protocol as p

from ._scorer import score_items
from ._scorer import tokens_of as _tokens
from ._setup import load_policy
from .payloads import LogprobsOut
from .worker import Actor, Outcome, WorkerContext

__all__ = ["RefLogp"]


class RefLogp(Actor):
    role: ClassVar[str] = Role.REF_LOGP.value
    claim_size: ClassVar[int] = 4

    def on_start(self, ctx: WorkerContext) -> None:
        self.cfg = ctx.config
        self.model, self.codec = load_policy(ctx.config, self.role)

    def process(self, lease: p.Lease) -> Outcome:
        temperature = self.cfg.algorithm.temperature
        scores = score_items(self.model, lease.items, self.codec.pad_id, temperature)
        return Outcome(
            tuple(
                p.Result(item.gid, LogprobsOut(score, None).to_payload())
                for item, score in zip(lease.items, scores, strict=True)
            ),
            tokens=_tokens(lease),
        )
