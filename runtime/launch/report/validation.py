"""What a validation line (``validation.jsonl``) or an evaluation line (``eval.jsonl``)
holds, read the same way for both: its k, its pass@J, its data sources.

A pass with k samples per prompt carries ``val_reward`` (mean@k), ``val_best_reward``,
``val_pass@J`` for each J of ``val_pass_ks``, and per data source a mapping in
``val_by_source``. A line of an older run carries ``val_reward`` alone: it has no J, no
source, and k = 1. Anything of the wrong type reads as absent, as in the rest of the
report: a line is data from disk, not a promise.
"""

from __future__ import annotations

from typing import Any

__all__ = ["largest_k", "number", "pass_ks", "source_metric", "sources"]


def number(value: object) -> float | None:
    """``value`` if it is a number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def pass_ks(line: dict[str, Any]) -> list[int]:
    """The J of the line's ``val_pass@J``, ascending; [] for a line of an older run."""
    ks = line.get("val_pass_ks")
    if not isinstance(ks, list):
        return []
    return sorted({k for k in ks if isinstance(k, int) and not isinstance(k, bool) and k > 0})


def largest_k(line: dict[str, Any]) -> int:
    """The k of the line's pass@k (its largest J; else its samples per prompt; else 1)."""
    ks = pass_ks(line)
    if ks:
        return ks[-1]
    for key in ("val_samples", "samples"):
        samples = line.get(key)
        if isinstance(samples, int) and not isinstance(samples, bool) and samples > 0:
            return samples
    return 1


def sources(lines: list[dict[str, Any]]) -> list[str]:
    """The data sources the lines report, in the order they were first named."""
    names: dict[str, None] = {}
    for line in lines:
        listed = line.get("val_sources")
        by_source = line.get("val_by_source")
        for name in (listed if isinstance(listed, list) else []) + (
            list(by_source) if isinstance(by_source, dict) else []
        ):
            if isinstance(name, str):
                names.setdefault(name, None)
    return list(names)


def source_metric(line: dict[str, Any], source: str, key: str) -> float | None:
    """One figure of one data source (``reward``, ``best_reward``, ``pass@J``,
    ``response_tokens``, ``prompts``), or None where the line lacks it."""
    by_source = line.get("val_by_source")
    if not isinstance(by_source, dict):
        return None
    figures = by_source.get(source)
    return number(figures.get(key)) if isinstance(figures, dict) else None
