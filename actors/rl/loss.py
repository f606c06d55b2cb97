"""The GRPO policy loss over one micro-batch: decoupled PPO with clip-higher and optional KL.

Three policies meet here. The *behaviour* policy is the generator's, which sampled the
tokens, possibly several weight versions ago. The *proximal* policy is a recent one whose
log-probs the ``logp`` role recomputed. The current policy is the trainer's, whose ``logp``
carries the gradient. Decoupled PPO (as in AReaL) clips the current policy's ratio against
the proximal policy, so the trust region is anchored on recent weights, and corrects for
the off-policy sampling with an importance weight of proximal/behaviour, truncated so one
very stale token cannot dominate the step (correction.py: that ratio's off-policy and
engine parts, each weighted and possibly rejected on its own). CISPO (MiniMax-M1) instead
weighs a REINFORCE term by the clipped, detached current/proximal ratio, so that no token
loses its gradient to the clip.

All functions are pure: tensors in, tensors out; nothing here reads a model or the bus.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Literal, get_args

import torch

from asyncrl.runtime.contract.config.learning import Estimator, PolicyLoss, Ratio
from asyncrl.runtime.contract.config.recipes import CorrectionSection

from .advantages import check_estimator
from .correction import check_correction, correct

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGGS",
    "POLICY_LOSSES",
    "RATIOS",
    "KLEstimator",
    "LossAgg",
    "LossConfig",
    "LossStats",
    "Ratio",
    "loss_metrics",
    "merge_stats",
    "policy_loss",
]

KLEstimator = Literal["k1", "k3"]
LossAgg = Literal["token", "sequence"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)
LOSS_AGGS: tuple[str, ...] = get_args(LossAgg)
RATIOS: tuple[str, ...] = get_args(Ratio)
POLICY_LOSSES: tuple[str, ...] = get_args(PolicyLoss)


@dataclass(frozen=True)
class LossConfig:
    """The knobs of :func:`policy_loss`, checked once at construction.

    ``clip_low``/``clip_high``: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``. A
    larger ``clip_high`` ("clip-higher", DAPO) lets unlikely tokens with positive advantage
    grow faster, which keeps entropy from collapsing.
    ``offpolicy`` / ``engine``: the corrections of the two parts of the proximal/behaviour
    ratio (correction.py); the defaults weigh each token by ``min(proximal/behaviour, 5)``.
    ``policy_loss``: ``"ppo"`` (the clipped surrogate) or ``"cispo"`` (see
    :func:`policy_loss`); CISPO takes ``ratio="token"`` and no dual clip.
    ``kl_coef``: weight of the per-token KL to the reference policy; 0 turns the penalty off.
    ``kl_estimator``: ``"k1"`` (``log p - log ref``) or ``"k3"`` (non-negative, low variance).
    ``loss_agg``: ``"token"`` (every token in the step weighs the same) or ``"sequence"``
    (every sequence weighs the same, its tokens share its weight).
    ``estimator``: the one used for the advantages, since ``"dr_grpo"`` also fixes the
    loss normaliser (see :func:`policy_loss`).
    ``ratio``: ``"token"`` (PPO's per-token ratio) or ``"sequence"`` (GSPO's: the geometric
    mean of the sequence's token ratios, one trust region per sequence).
    ``clip_ratio_c``: dual clip (Ye et al. 2019): where the advantage is negative, a
    token's surrogate loss is at most ``-A * clip_ratio_c``, however large its ratio (a
    stale token whose probability grew a hundredfold would otherwise push a hundredfold);
    0 turns it off, else it must be > 1.
    ``entropy_coef``: weight of the entropy bonus (the loss minus it times the entropy,
    aggregated like the loss); 0 turns it off.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    offpolicy: CorrectionSection = field(default_factory=CorrectionSection)
    engine: CorrectionSection = field(default_factory=CorrectionSection)
    policy_loss: PolicyLoss = "ppo"
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    loss_agg: LossAgg = "token"
    estimator: Estimator = "grpo"
    ratio: Ratio = "token"
    clip_ratio_c: float = 0.0
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.clip_low < 1.0:
            # 1 - clip_low is the lower ratio bound and must stay positive.
            raise ValueError(f"clip_low must be in [0, 1), got {self.clip_low!r}")
        if not 0.0 <= self.clip_high < math.inf:
            raise ValueError(f"clip_high must be finite and >= 0, got {self.clip_high!r}")
        check_correction("offpolicy", self.offpolicy)
        check_correction("engine", self.engine)
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(
                f"policy_loss must be one of {POLICY_LOSSES}, got {self.policy_loss!r}"
            )
        if not 0.0 <= self.kl_coef < math.inf:
            raise ValueError(f"kl_coef must be finite and >= 0, got {self.kl_coef!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}"
            )
        if self.loss_agg not in LOSS_AGGS:
            raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {self.loss_agg!r}")
        check_estimator(self.estimator)
        if self.ratio not in RATIOS:
            raise ValueError(f"ratio must be one of {RATIOS}, got {self.ratio!r}")
        if self.clip_ratio_c != 0.0 and not 1.0 < self.clip_ratio_c < math.inf:
            raise ValueError(f"clip_ratio_c must be 0 (off) or > 1, got {self.clip_ratio_c!r}")
        if not 0.0 <= self.entropy_coef < math.inf:
            raise ValueError(f"entropy_coef must be finite and >= 0, got {self.entropy_coef!r}")
        if self.policy_loss == "cispo" and self.ratio != "token":
            raise ValueError(f"policy_loss 'cispo' needs ratio 'token', got {self.ratio!r}")
        if self.policy_loss == "cispo" and self.clip_ratio_c:
            raise ValueError(
                f"policy_loss 'cispo' takes no clip_ratio_c, got {self.clip_ratio_c!r}"
            )


@dataclass(frozen=True)
class LossStats:
    """Sums over one micro-batch's tokens in the loss (trained, and not taken out by a
    correction), to be added up across a step.

    Every field is a detached 0-d tensor on the inputs' device (counts too, stored as
    floats), so that a trainer pays no device-to-host copy per micro-batch: it collects them
    and calls :func:`loss_metrics` once per step. Being sums, they also all-reduce across
    data-parallel ranks unchanged. (What the corrections did is counted over the rows before
    any is taken out: correction.CorrectionStats.)

    ``clipped`` counts the tokens whose ratio the clip bound (PPO: where the clipped side
    won; CISPO: where the weight's clip changed it). ``dual_clipped`` counts the tokens
    whose loss the dual clip bound.
    ``kl_sum`` is None when no ``ref_logp`` was given, ``entropy_sum`` when no
    ``entropy`` was.
    """

    tokens: torch.Tensor
    clipped: torch.Tensor
    ratio_sum: torch.Tensor
    behaviour_proximal_abs_diff_sum: torch.Tensor
    dual_clipped: torch.Tensor
    kl_sum: torch.Tensor | None = None
    entropy_sum: torch.Tensor | None = None


def policy_loss(
    logp: torch.Tensor,
    proximal_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    total_tokens: float,
    total_sequences: float,
    max_len: int,
    engine_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The scalar loss of one micro-batch, and its :class:`LossStats`.

    Shapes: every log-prob tensor and ``mask`` are ``[B, T]`` (B sequences, T response
    positions; ``mask`` is bool or 0/1, true on real response tokens); ``advantages`` is
    ``[B]``, one per sequence shared by its tokens, or ``[B, T]``, one per token. Only
    ``logp`` gets a gradient, and ``entropy`` (``[B, T]``, the entropy of the distribution
    each token was drawn from) when ``entropy_coef > 0``; the others are detached here
    whatever the caller passes.
    Padded positions may hold any value, even inf or NaN: they are zeroed before any
    arithmetic so they cannot leak into the loss or its gradient.

    Per token, with ``r = exp(logp - proximal_logp)`` and ``w`` the corrections' weight of
    ``proximal/behaviour`` (correction.py: by default ``min(exp(proximal_logp -
    behaviour_logp), 5)``; ``engine_tokens``, bool ``[B, T]``, marks the tokens whose ratio
    is its engine part, None: none is)::

        loss_t = -w * min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A) + kl_coef * kl_t

    or with ``policy_loss="cispo"``::

        loss_t = -w * sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logp_t + kl_coef * kl_t

    whose gradient is the REINFORCE one, ``-w * clip(r) * A * grad(logp_t)``, on every
    token (PPO's clip zeroes a clipped token's gradient; CISPO only bounds its size).
    A token a correction rejects is out of the loss, of every statistic here and of the
    GSPO sequence ratio's mean; the caller leaves it out of the normalisers too.

    where ``kl_t`` is k1 ``logp - ref`` or k3 ``exp(ref - logp) - (ref - logp) - 1``. With
    ``clip_ratio_c`` (dual clip), where ``A < 0`` the ``min(...)`` is first raised to at
    least ``clip_ratio_c * A``, so ``loss_t <= -w * clip_ratio_c * A + kl``. With
    ``entropy_coef > 0``, ``- entropy_coef * entropy_t`` is added to ``loss_t`` (a bonus
    for keeping the distribution spread). With
    ``ratio="sequence"`` (GSPO), ``r`` is ``s_i = exp(mean_t(logp - proximal_logp))`` on
    every token of sequence ``i``, written ``sg(s_i) * exp(logp_t - sg(logp_t))`` so that its
    value is ``s_i`` and each token's gradient is its own log-prob's times ``s_i``. The KL
    term is added when ``kl_coef > 0`` (which then requires ``ref_logp``); given a
    ``ref_logp`` with ``kl_coef == 0``, the KL is still measured for the stats only.

    Aggregation is built for gradient accumulation: the normalisers are the whole
    optimizer step's, passed in, so summing the losses of a step's micro-batches gives
    exactly the loss (and gradient) of the step as one batch.

    - ``loss_agg="token"``: ``sum(loss_t) / total_tokens``, with ``total_tokens`` the mask
      sum over the step.
    - ``loss_agg="sequence"``: ``sum_i mean_t(loss_t of i) / total_sequences``; a sequence
      with no response token contributes 0.
    - ``estimator="dr_grpo"``: ``sum(loss_t) / (total_sequences * max_len)`` whatever
      ``loss_agg`` says. Dr. GRPO replaces every length-dependent normaliser with a constant,
      ``max_len`` being the generation budget (max new tokens), because dividing by a
      response's own length gives short correct answers a larger per-token push and long
      wrong ones a smaller penalty, a bias towards long wrong answers.

    With data parallelism whose gradient all-reduce averages over ``world`` ranks, pass the
    global totals divided by ``world``.
    """
    _check_inputs(
        logp, proximal_logp, behaviour_logp, advantages, mask, ref_logp, entropy, cfg, engine_tokens
    )
    _check_totals(total_tokens=total_tokens, total_sequences=total_sequences, max_len=max_len)

    trained = mask.to(torch.bool)
    dtype = torch.promote_types(logp.dtype, torch.float32)  # no log-prob math in half precision
    logp = logp.to(dtype)
    proximal, behaviour = (t.detach().to(dtype) for t in (proximal_logp, behaviour_logp))
    ref = None if ref_logp is None else ref_logp.detach().to(dtype)

    corrected = correct(proximal, behaviour, engine_tokens, trained, cfg.offpolicy, cfg.engine)
    real = corrected.keep  # the tokens in the loss, from here on
    weight = _masked(corrected.weight, real)
    ratio = _ratio(logp, proximal, real, cfg.ratio)
    proximal_minus_behaviour = _masked(proximal - behaviour, real)
    per_token_advantages = advantages.detach().to(dtype)
    if per_token_advantages.ndim == 1:
        per_token_advantages = per_token_advantages[:, None]
    else:  # padding may hold anything, and NaN * 0 in the backward pass is NaN
        per_token_advantages = _masked(per_token_advantages, real)
    if cfg.policy_loss == "cispo":
        per_token, clipped = _cispo(logp, ratio, per_token_advantages, real, cfg)
        dual_clipped = torch.zeros_like(clipped)
    else:
        surrogate, clipped = _clipped_surrogate(ratio, per_token_advantages, cfg)
        surrogate, dual_clipped = _dual_clipped(surrogate, per_token_advantages, cfg.clip_ratio_c)
        per_token = surrogate
    per_token = -weight * per_token

    kl = None if ref is None else _kl(logp, ref, real, cfg.kl_estimator)
    if kl is not None and cfg.kl_coef > 0:
        per_token = per_token + cfg.kl_coef * kl
    if entropy is not None:
        # where, not a product: a padded position may hold anything (see the docstring)
        entropy = _masked(entropy.to(dtype) if cfg.entropy_coef > 0 else entropy.detach(), real)
        if cfg.entropy_coef > 0:
            per_token = per_token - cfg.entropy_coef * entropy
    per_token = _masked(per_token, real)

    loss = _aggregate(per_token, real, cfg, total_tokens, total_sequences, max_len)
    stats = _stats(real, ratio, clipped, dual_clipped, proximal_minus_behaviour, kl, entropy)
    return loss, stats


def _masked(values: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``values`` with 0 at padded positions (a select, not a product: 0 * inf is NaN)."""
    return torch.where(real, values, 0.0)


def _ratio(
    logp: torch.Tensor, proximal: torch.Tensor, real: torch.Tensor, kind: str
) -> torch.Tensor:
    """The current/proximal ratio per token: PPO's own, or GSPO's sequence-level one."""
    log_ratio = _masked(logp - proximal, real)
    if kind == "token":
        return log_ratio.exp()
    lengths = real.sum(dim=1, keepdim=True).clamp(min=1)  # empty rows: 0 / 1, not 0 / 0
    sequence = (log_ratio.sum(dim=1, keepdim=True) / lengths).detach()
    own = _masked(logp, real)
    return _masked(sequence + own - own.detach(), real).exp()


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, cfg: LossConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic surrogate ``min(r*A, clip(r)*A)`` and where its clipped side won.

    The clipped side is taken only where it is strictly smaller, i.e. the ratio left the
    trust region in the direction the advantage pushes it. There ``clip(r)`` is a constant,
    so those tokens give no gradient: that is the trust region at work.
    """
    adv = advantages  # [B, 1] or [B, T]: broadcasts over the tokens either way
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    took_clipped = clipped < unclipped
    return torch.where(took_clipped, clipped, unclipped), took_clipped


def _cispo(
    logp: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    real: torch.Tensor,
    cfg: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO's term ``sg(clip(r)) * A * logp`` per token (the loss is minus it, times the
    corrections' weight), and where the clip changed the ratio. The weight is detached, so
    every token keeps its log-prob's gradient, only scaled by at most ``1 + clip_high``."""
    bounded = ratio.detach().clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    changed = bounded != ratio.detach()
    return bounded * advantages * _masked(logp, real), changed


def _dual_clipped(
    surrogate: torch.Tensor, advantages: torch.Tensor, clip_ratio_c: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The surrogate raised to at least ``clip_ratio_c * A`` where ``A < 0``, and where that
    bound won. PPO's clip bounds a negative advantage's loss only from below (a ratio
    under ``1 - clip_low``): a ratio far above 1 leaves it unbounded. Where the bound wins
    it is a constant, so those tokens give no gradient."""
    if not clip_ratio_c:
        return surrogate, torch.zeros_like(surrogate, dtype=torch.bool)
    bound = clip_ratio_c * advantages
    bound_won = (advantages < 0) & (bound > surrogate)
    return torch.where(bound_won, bound, surrogate), bound_won


def _kl(logp: torch.Tensor, ref: torch.Tensor, real: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(current || reference) from the sampled tokens' log-probs.

    Both are unbiased for tokens sampled from the current policy. k1 can be negative per
    token and is noisy; k3 (Schulman's) is never negative and lower in variance, which is why
    GRPO uses it.
    """
    log_ref_ratio = _masked(ref - logp, real)
    if estimator == "k1":
        return -log_ref_ratio
    return log_ref_ratio.exp() - log_ref_ratio - 1.0


def _aggregate(
    per_token: torch.Tensor,
    real: torch.Tensor,
    cfg: LossConfig,
    total_tokens: float,
    total_sequences: float,
    max_len: int,
) -> torch.Tensor:
    """Reduce masked per-token losses to the micro-batch's share of the step's loss."""
    if cfg.estimator == "dr_grpo":
        return per_token.sum() / (total_sequences * max_len)
    if cfg.loss_agg == "token":
        return per_token.sum() / total_tokens
    lengths = real.sum(dim=1).clamp(min=1).to(per_token.dtype)  # empty rows: 0 / 1, not 0 / 0
    return (per_token.sum(dim=1) / lengths).sum() / total_sequences


@torch.no_grad()
def _stats(
    real: torch.Tensor,
    ratio: torch.Tensor,
    clipped: torch.Tensor,
    dual_clipped: torch.Tensor,
    proximal_minus_behaviour: torch.Tensor,
    kl: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> LossStats:
    """The micro-batch's :class:`LossStats`; every input is already 0 or 1 at padding."""
    dtype = ratio.dtype
    return LossStats(
        tokens=real.sum().to(dtype),
        clipped=(clipped & real).sum().to(dtype),
        ratio_sum=_masked(ratio, real).sum(),
        behaviour_proximal_abs_diff_sum=proximal_minus_behaviour.abs().sum(),
        dual_clipped=(dual_clipped & real).sum().to(dtype),
        kl_sum=None if kl is None else kl.sum(),
        entropy_sum=None if entropy is None else entropy.sum().to(dtype),
    )


def merge_stats(stats: Sequence[LossStats]) -> LossStats:
    """One :class:`LossStats` for several micro-batches: the sums add."""
    if not stats:
        raise ValueError("stats must hold at least one LossStats")
    for optional in ("kl_sum", "entropy_sum"):
        given = sum(getattr(s, optional) is not None for s in stats)
        if given not in (0, len(stats)):
            raise ValueError(f"stats mix micro-batches with and without {optional}")
    merged: dict[str, torch.Tensor | None] = {}
    for stat in fields(LossStats):
        values = [getattr(s, stat.name) for s in stats]
        merged[stat.name] = None if values[0] is None else torch.stack(values).sum()
    return LossStats(**merged)  # type: ignore[arg-type]


def loss_metrics(stats: LossStats | Sequence[LossStats]) -> dict[str, float]:
    """Per-token means and fractions of a step's stats, as plain floats for logging.

    Keys: ``clip_frac``, ``dual_clip_frac``, ``ratio_mean``,
    ``behaviour_proximal_abs_diff`` and, when they were measured, ``kl_ref`` and
    ``entropy`` (mean nats per token); per token in the loss. (What the corrections did:
    correction.correction_metrics.)
    All values are copied to the host in one transfer.
    """
    s = stats if isinstance(stats, LossStats) else merge_stats(stats)
    names = [f.name for f in fields(LossStats) if getattr(s, f.name) is not None]
    values = torch.stack([getattr(s, name).detach().float() for name in names]).tolist()
    v = dict(zip(names, values, strict=True))
    tokens = max(v["tokens"], 1.0)  # a step with no tokens reports zeros, not NaN
    metrics = {
        "clip_frac": v["clipped"] / tokens,
        "dual_clip_frac": v["dual_clipped"] / tokens,
        "ratio_mean": v["ratio_sum"] / tokens,
        "behaviour_proximal_abs_diff": v["behaviour_proximal_abs_diff_sum"] / tokens,
    }
    if "kl_sum" in v:
        metrics["kl_ref"] = v["kl_sum"] / tokens
    if "entropy_sum" in v:
        metrics["entropy"] = v["entropy_sum"] / tokens
    return metrics


def _check_inputs(
    logp: torch.Tensor,
    proximal_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
    entropy: torch.Tensor | None,
    cfg: LossConfig,
    engine_tokens: torch.Tensor | None = None,
) -> None:
    """Shape and type checks, each ValueError naming the argument at fault."""
    if not isinstance(cfg, LossConfig):
        raise ValueError(f"cfg must be a LossConfig, got {type(cfg).__name__}")
    if not isinstance(logp, torch.Tensor) or logp.ndim != 2 or not logp.is_floating_point():
        raise ValueError(f"logp must be a floating [B, T] tensor, got {_describe(logp)}")
    if logp.numel() == 0:
        raise ValueError(f"logp must be non-empty, got shape {tuple(logp.shape)}")
    named = {
        "proximal_logp": proximal_logp,
        "behaviour_logp": behaviour_logp,
        "mask": mask,
        "engine_tokens": engine_tokens,
        "ref_logp": ref_logp,
        "entropy": entropy,
    }
    for name, tensor in named.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor) or tensor.shape != logp.shape:
            raise ValueError(
                f"{name} must have logp's shape {tuple(logp.shape)}, got {_describe(tensor)}"
            )
    if not isinstance(advantages, torch.Tensor) or advantages.shape not in (
        logp.shape[:1],
        logp.shape,
    ):
        raise ValueError(
            f"advantages must have shape [B] = {tuple(logp.shape[:1])} or [B, T] = "
            f"{tuple(logp.shape)}, got {_describe(advantages)}"
        )
    if cfg.kl_coef > 0 and ref_logp is None:
        raise ValueError(f"ref_logp is required when kl_coef > 0 (kl_coef={cfg.kl_coef})")
    if cfg.entropy_coef > 0 and entropy is None:
        raise ValueError(f"entropy is required when entropy_coef > 0 ({cfg.entropy_coef})")


def _check_totals(**totals: float) -> None:
    """The step-wide normalisers must be positive (``not > 0`` also rejects NaN)."""
    for name, value in totals.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)} ({value.dtype})"
    return type(value).__name__
