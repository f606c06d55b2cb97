"""The nested sections of the recipes an algorithm (or a critic) may switch on: its
learning-rate schedule, dynamic sampling, the corrections of the behaviour sampling and
router replay (the fields' metadata: fields.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .fields import doc

__all__ = [
    "CorrectionReject",
    "CorrectionSection",
    "CorrectionWeight",
    "CorrectionsSection",
    "FilterGroupsSection",
    "FilterMetric",
    "RouterReplaySection",
    "ScheduleKind",
    "ScheduleSection",
]

# How a correction weighs a part of the proximal/behaviour ratio, and which tokens or
# sequences it takes out of the loss (actors/rl/correction.py has the formulas).
CorrectionWeight = Literal["none", "token", "sequence", "geometric"]
CorrectionReject = Literal["none", "token", "sequence", "geometric"]
# What dynamic sampling judges a group by: the task's own reward, or the reward trained on
# (the task's plus any shaping, such as an overlong penalty).
FilterMetric = Literal["task", "reward"]
ScheduleKind = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSection:
    """How a learning rate moves over a run's train steps (actors/training/schedule.py has
    the formula): a linear warm-up, then constant, or a linear or cosine decay to a floor."""

    kind: ScheduleKind = field(
        default="constant",
        metadata=doc(
            "after the warm-up: constant (the rate itself), linear or cosine (decay from "
            "the rate to min_lr_ratio x the rate over decay_steps steps, the floor after)"
        ),
    )
    warmup_steps: int = field(
        default=0,
        metadata=doc(
            "train steps of linear warm-up: the k-th (from 1) takes k / warmup_steps of "
            "the rate; 0 = none",
            min=0,
        ),
    )
    min_lr_ratio: float = field(
        default=0.0,
        metadata=doc("the decay's floor, as a fraction of the rate (linear, cosine)", min=0, max=1),
    )
    decay_steps: int = field(
        default=0,
        metadata=doc(
            "train steps after which the decay is at its floor, warm-up included "
            "(linear, cosine); 0 = run.total_steps",
            min=0,
        ),
    )

    def __post_init__(self) -> None:
        # A decay that ends before the warm-up does would skip from the rate to the floor.
        if self.kind != "constant" and self.decay_steps and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"decay_steps: got {self.decay_steps} with warmup_steps={self.warmup_steps}; "
                "allowed: more than warmup_steps, or 0 (run.total_steps)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterGroupsSection:
    """Dynamic sampling (DAPO): groups whose rewards carry no signal never reach the trainer."""

    enabled: bool = field(
        default=False,
        metadata=doc(
            "leave out of training each group whose rewards carry no signal (state "
            "'filtered'); the freed slot is admitted again at once, so batches stay full"
        ),
    )
    metric: FilterMetric = field(
        default="task",
        metadata=doc(
            "what a group is judged by: task (the task's own reward) or reward (the one "
            "trained on, shaping included)"
        ),
    )
    min_std: float = field(
        default=0.0,
        metadata=doc("a group carries signal iff the metric's std over it is above this", min=0),
    )
    mean_low: float | None = field(
        default=None,
        metadata=doc("a group whose metric mean is below this is filtered; empty: no bound"),
    )
    mean_high: float | None = field(
        default=None,
        metadata=doc("a group whose metric mean is above this is filtered; empty: no bound"),
    )
    max_filtered_batches: int = field(
        # At a filtered fraction f a run that learns passes the bound after a group with
        # signal with probability f^(bound + 1): 2e-10 at the 0.87 the embedded DAPO run
        # filtered with 20 batches of 8, where 10 would stop one run in thirty.
        default=20,
        metadata=doc(
            "the run stops with an error once more than this many train batches' worth of "
            "groups are filtered in a row, none judged to carry signal between",
            min=1,
        ),
    )

    def __post_init__(self) -> None:
        low, high = self.mean_low, self.mean_high
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"mean_low: got {low} above mean_high={high}; allowed: mean_low <= mean_high"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrectionSection:
    """One part of the proximal/behaviour ratio (the off-policy part or the engine part):
    how it weighs the loss and what it takes out of it (docs: concepts/estimators)."""

    weight: CorrectionWeight = field(
        default="token",
        metadata=doc(
            "truncated importance weight: none, token (the token's own part), sequence "
            "(the product of the sequence's token parts) or geometric (their geometric "
            "mean), capped at cap; a sequence kind weighs every token of the sequence"
        ),
    )
    cap: float = field(
        default=5.0, metadata=doc("the weight is truncated at this value", exclusive_min=0)
    )
    reject: CorrectionReject = field(
        default="none",
        metadata=doc(
            "none; token (IcePop: a token whose part leaves [low, high] gives no loss); "
            "sequence or geometric (a sequence whose product or geometric mean of parts "
            "leaves [low, high] gives no loss at all)"
        ),
    )
    low: float = field(
        default=0.5,
        metadata=doc("the lower bound of reject's interval", exclusive_min=0, max=1),
    )
    high: float = field(default=2.0, metadata=doc("the upper bound of reject's interval", min=1))


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrectionsSection:
    """The proximal/behaviour ratio of a token, split in two parts that multiply back to
    it: a token sampled by the version logp scored it with (in a group logp scored, not
    reused) has its whole ratio as its engine part; any other token has it as its
    off-policy part."""

    offpolicy: CorrectionSection = field(
        default_factory=CorrectionSection,
        metadata=doc("the part of tokens sampled by another version than logp's (staleness)"),
    )
    engine: CorrectionSection = field(
        default_factory=CorrectionSection,
        metadata=doc(
            "the part of tokens sampled by logp's own version: the generator's numerics "
            "against the trainer side's"
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterReplaySection:
    """Router replay for a mixture-of-experts model: the generator records the experts its
    router chose for every token, and the scorers and the trainer route each token through
    those experts (guides/router-replay.md)."""

    enabled: bool = field(
        default=False,
        metadata=doc(
            "the generator records each token's experts in every mixture-of-experts layer "
            "and logp and train route the token through them, the gates' weights still "
            "from the current router (a model with experts; backends.generate=torch; "
            "backends.train=torch, or megatron without pipeline stages)"
        ),
    )
    ref_logp: bool = field(
        default=False,
        metadata=doc("ref_logp replays the recorded experts too (with enabled)"),
    )

    def __post_init__(self) -> None:
        if self.ref_logp and not self.enabled:
            raise ValueError("ref_logp: got true with enabled=false; allowed: enabled=true")
