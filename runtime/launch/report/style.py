"""One colour per role, the same in every picture of a report."""

from __future__ import annotations

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE

__all__ = ["role_colour"]

# Matplotlib's tab10, in the pipeline's data-flow order; other roles take the rest.
_PALETTE = ("#8c564b", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#d62728",
            "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")  # fmt: skip
_FIXED = dict(zip(DEFAULT_PIPELINE.worker_roles, _PALETTE, strict=False))


def role_colour(role: str) -> str:
    if role in _FIXED:
        return _FIXED[role]
    spare = _PALETTE[len(_FIXED) :]
    return spare[sum(map(ord, role)) % len(spare)]  # stable across runs, unlike hash()
