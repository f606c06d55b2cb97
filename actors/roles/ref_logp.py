"""The ``ref_logp`` role: log-probs of generated responses under the frozen reference model.

Consumes ``transition.*.generated``; produces :class:`LogprobsOut` (version None). The
reference is the base model (``model.path``) and never changes; the trainer's optional
KL penalty (``algorithm.kl_coef``) keeps the policy near it. ``pipeline.workers.ref_logp``
> 1 makes its workers one group of ranks over which the reference is sharded.
"""

from __future__ import annotations

from typing import ClassVar

from asyncrl.runtime.contract.stages import Role

from ..training.scorer import ScoringActor

__all__ = ["RefLogp"]


class RefLogp(ScoringActor):
    """Scores under the base model as loaded at start; it never loads a version."""

    role: ClassVar[str] = Role.REF_LOGP.value
