"""The corrections of the behaviour sampling: importance weights and rejection.

A token's ratio ``q/b`` (proximal over behaviour probability) mixes two gaps. Its
*off-policy* gap: the token was sampled by an older version than the one logp scored it
with. Its *engine* gap: the generator's numerics (kernels, precision, batch shapes) are not
the trainer side's, so even one version gives two probabilities. The two cannot be told
apart on one token, so the ratio is split by versions into two parts that multiply back
to it: a token sampled by the version logp scored it with (in a group logp scored, not
reused) has its whole ratio as its engine part and off-policy part 1; any other token has
its whole ratio as its off-policy part and engine part 1 (its own engine gap is in there
too, unmeasured).

Each part has a correction (``algorithm.correction.offpolicy`` / ``.engine``):

- ``weight``: the truncated importance weight ``min(x, cap)``, with ``x`` the token's own
  part (``token``), the product of the sequence's token parts (``sequence``) or their
  geometric mean ``exp(mean log part)`` over the tokens that part covers in the sequence,
  1 if none (``geometric``); a sequence kind gives every token of the sequence one weight.
  A part weighs nothing (1) where it covers no token (token kind) or a row where it covers
  none (sequence kinds), so a cap below 1 truncates only what the part covers.
- ``reject``: ``token`` masks each token whose part leaves ``[low, high]`` (IcePop);
  ``sequence`` / ``geometric`` take out every token of a sequence whose product /
  geometric mean leaves ``[low, high]``.

A token's weight is the product of its two parts' weights; it gives loss iff neither part
rejected it. With the defaults (both ``token``, cap 5, no rejection) that is
``min(q/b, 5)``, since one of the two parts is 1.

Pure: tensors in, tensors out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import get_args

import torch

from asyncrl.runtime.contract.config.recipes import (
    CorrectionReject,
    CorrectionSection,
    CorrectionWeight,
)

__all__ = [
    "PARTS",
    "Correction",
    "CorrectionStats",
    "check_correction",
    "correct",
    "correction_metrics",
    "merge_correction_stats",
]

PARTS = ("offpolicy", "engine")
WEIGHTS: tuple[str, ...] = get_args(CorrectionWeight)
REJECTS: tuple[str, ...] = get_args(CorrectionReject)
# A part's raw weight is reported up to exp(this): a stale sequence's product can pass
# float32's range, and an infinity would not survive the step line's JSON.
_MAX_REPORTED_LOG = 80.0


def check_correction(name: str, c: CorrectionSection) -> None:
    """ValueError naming the field of ``name`` (e.g. ``offpolicy``) at fault."""
    if not isinstance(c, CorrectionSection):
        raise ValueError(f"{name} must be a CorrectionSection, got {type(c).__name__}")
    if c.weight not in WEIGHTS:
        raise ValueError(f"{name}.weight must be one of {WEIGHTS}, got {c.weight!r}")
    if c.reject not in REJECTS:
        raise ValueError(f"{name}.reject must be one of {REJECTS}, got {c.reject!r}")
    if not c.cap > 0.0:
        raise ValueError(f"{name}.cap must be > 0, got {c.cap!r}")
    if not 0.0 < c.low <= 1.0:
        raise ValueError(f"{name}.low must be in (0, 1], got {c.low!r}")
    if not c.high >= 1.0:  # not >= also refuses NaN
        raise ValueError(f"{name}.high must be >= 1, got {c.high!r}")


@dataclass(frozen=True)
class CorrectionStats:
    """Sums (and, for ``*_weight_max``, maxima) over a set of rows, to be added up across
    a step like :class:`~.loss.LossStats`: detached 0-d tensors.

    ``tokens``/``sequences``: the trained tokens and rows before any correction;
    ``kept_tokens``/``kept_sequences``: those left in the loss (a row whose every trained
    token was taken out is not kept; a row that had none stays counted, as without
    corrections). Per part ``p``: ``p_weight_sum``/``p_weight_max`` of the weight before
    truncation per trained token (the token part where ``weight`` is ``none``),
    ``p_truncated`` the tokens truncation lowered, ``p_masked`` the tokens the token
    rejection took out, ``p_rejected`` the rows the sequence rejection took out.
    """

    tokens: torch.Tensor
    sequences: torch.Tensor
    kept_tokens: torch.Tensor
    kept_sequences: torch.Tensor
    offpolicy_weight_sum: torch.Tensor
    offpolicy_weight_max: torch.Tensor
    offpolicy_truncated: torch.Tensor
    offpolicy_masked: torch.Tensor
    offpolicy_rejected: torch.Tensor
    engine_weight_sum: torch.Tensor
    engine_weight_max: torch.Tensor
    engine_truncated: torch.Tensor
    engine_masked: torch.Tensor
    engine_rejected: torch.Tensor


@dataclass(frozen=True)
class Correction:
    """What :func:`correct` gives: per token the weight (``[B, T]``, detached, 1 at padding)
    and whether it stays in the loss (``keep``, bool ``[B, T]``, false at padding), and the
    rows' :class:`CorrectionStats`."""

    weight: torch.Tensor
    keep: torch.Tensor
    stats: CorrectionStats


@dataclass(frozen=True)
class _Part:
    weight: torch.Tensor  # [B, T] truncated, 1 where the part is off
    raw_log: torch.Tensor  # [B, T] log of the weight before truncation
    truncated: torch.Tensor  # bool [B, T]
    masked: torch.Tensor  # bool [B, T] token rejection
    rejected: torch.Tensor  # bool [B] sequence rejection


@torch.no_grad()
def correct(
    proximal_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    engine_tokens: torch.Tensor | None,
    mask: torch.Tensor,
    offpolicy: CorrectionSection,
    engine: CorrectionSection,
) -> Correction:
    """The corrections of ``[B, T]`` rows (module docstring). ``engine_tokens`` (bool
    ``[B, T]``) marks the tokens whose ratio is their engine part; None: none is.
    ``mask`` is true on trained tokens; padded positions may hold anything."""
    real = mask.to(torch.bool)
    dtype = torch.promote_types(proximal_logp.dtype, torch.float32)
    log_ratio = torch.where(real, proximal_logp.to(dtype) - behaviour_logp.to(dtype), 0.0)
    in_engine = real & (
        torch.zeros_like(real) if engine_tokens is None else engine_tokens.to(torch.bool)
    )
    in_offpolicy = real & ~in_engine
    parts = {
        "offpolicy": _part(torch.where(in_offpolicy, log_ratio, 0.0), in_offpolicy, offpolicy),
        "engine": _part(torch.where(in_engine, log_ratio, 0.0), in_engine, engine),
    }
    off, eng = parts["offpolicy"], parts["engine"]
    rejected = off.rejected | eng.rejected
    keep = real & ~off.masked & ~eng.masked & ~rejected[:, None]
    weight = torch.where(real, off.weight * eng.weight, 1.0)

    had_tokens = real.any(dim=1)
    dropped_rows = had_tokens & ~keep.any(dim=1)
    counted = {
        "tokens": real.sum(),
        "sequences": torch.tensor(real.shape[0]),
        "kept_tokens": keep.sum(),
        "kept_sequences": torch.tensor(real.shape[0]) - dropped_rows.sum(),
    }
    for name, part in parts.items():
        raw = torch.where(real, part.raw_log.clamp(max=_MAX_REPORTED_LOG).exp(), 0.0)
        counted[f"{name}_weight_sum"] = raw.sum()
        counted[f"{name}_weight_max"] = raw.amax()  # weights are > 0, so 0 is neutral
        counted[f"{name}_truncated"] = (part.truncated & real).sum()
        counted[f"{name}_masked"] = (part.masked & real).sum()
        counted[f"{name}_rejected"] = (part.rejected & had_tokens).sum()
    stats = CorrectionStats(**{k: v.to(dtype) for k, v in counted.items()})
    return Correction(weight=weight, keep=keep, stats=stats)


def _part(log_part: torch.Tensor, covered: torch.Tensor, c: CorrectionSection) -> _Part:
    """One part's correction; ``log_part`` is 0 wherever the part does not cover a token."""
    sequence_log = log_part.sum(dim=1)
    count = covered.sum(dim=1)
    geometric_log = torch.where(count > 0, sequence_log / count.clamp(min=1), 0.0)
    by_kind = {
        "token": log_part,
        "sequence": sequence_log[:, None].expand_as(log_part),
        "geometric": geometric_log[:, None].expand_as(log_part),
    }
    if c.weight == "none":
        raw_log = log_part
        weight = torch.ones_like(log_part)
        truncated = torch.zeros_like(covered)
    else:
        raw_log = by_kind[c.weight]
        # A part weighs only the tokens it covers (token), or the rows where it covers one
        # (sequence kinds): elsewhere it is 1 whatever the cap, so that the two parts'
        # product is one truncated weight of the whole ratio.
        applies = covered if c.weight == "token" else (count > 0)[:, None].expand_as(covered)
        # compared in log space: a product's exp may overflow, its log does not
        truncated = applies & (raw_log > math.log(c.cap))
        weight = torch.where(truncated, c.cap, torch.where(applies, raw_log.exp(), 1.0))
    low, high = math.log(c.low), math.log(c.high)
    masked = torch.zeros_like(covered)
    rejected = torch.zeros_like(covered[:, 0])
    if c.reject == "token":
        masked = covered & ((log_part < low) | (log_part > high))
    elif c.reject in ("sequence", "geometric"):
        value = sequence_log if c.reject == "sequence" else geometric_log
        rejected = (value < low) | (value > high)
    return _Part(weight, raw_log, truncated, masked, rejected)


def merge_correction_stats(stats: list[CorrectionStats]) -> CorrectionStats:
    """One :class:`CorrectionStats` for several sets of rows: sums add, maxima max."""
    if not stats:
        raise ValueError("stats must hold at least one CorrectionStats")
    merged = {}
    for field in fields(CorrectionStats):
        values = torch.stack([getattr(s, field.name) for s in stats])
        merged[field.name] = values.amax() if field.name.endswith("_max") else values.sum()
    return CorrectionStats(**merged)


def correction_metrics(stats: CorrectionStats | list[CorrectionStats]) -> dict[str, float]:
    """The step line's fields: per part ``p``, ``p_weight_mean`` and ``p_weight_max``
    (before truncation), ``p_truncated_frac`` and ``p_masked_frac`` (of trained tokens),
    ``p_rejected_frac`` (of rows)."""
    s = stats if isinstance(stats, CorrectionStats) else merge_correction_stats(stats)
    names = [f.name for f in fields(CorrectionStats)]
    v = dict(zip(names, torch.stack([getattr(s, n).float() for n in names]).tolist(), strict=True))
    tokens = max(v["tokens"], 1.0)  # nothing trained reports zeros, not NaN
    sequences = max(v["sequences"], 1.0)
    metrics: dict[str, float] = {}
    for p in PARTS:
        metrics[f"{p}_weight_mean"] = v[f"{p}_weight_sum"] / tokens
        metrics[f"{p}_weight_max"] = v[f"{p}_weight_max"]
        metrics[f"{p}_truncated_frac"] = v[f"{p}_truncated"] / tokens
        metrics[f"{p}_masked_frac"] = v[f"{p}_masked"] / tokens
        metrics[f"{p}_rejected_frac"] = v[f"{p}_rejected"] / sequences
    return metrics
