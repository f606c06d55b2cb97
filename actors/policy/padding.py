"""Cutting rows of different widths into runs that are each padded to their widest: where
the decoder feeds sequences catching up and the trainer cuts a step into micro-batches.

A run takes the next row while padding the run to its widest costs at most ``slack``
times the run's real tokens. Each run costs one more pass through the model, a few
milliseconds of CPU for a small model, so runs are not cut finer than the slack says.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["like_width_runs"]


def like_width_runs(
    widths: Sequence[int],
    slack: float,
    *,
    most: int | None = None,
    apart: Sequence[bool] | None = None,
) -> list[range]:
    """``widths`` (in their order) cut into consecutive runs whose padded size (rows x
    widest) is at most ``slack`` times their sum, a lone row always allowed. ``most``:
    no run's padded size above it, unless a row alone is wider. ``apart[i]``: row ``i``
    starts a run of its own (it does not sit next to the one before)."""
    runs: list[range] = []
    start = widest = total = 0
    for i, width in enumerate(widths):
        if i > start:
            padded = (i - start + 1) * max(widest, width)
            over = padded > slack * (total + width) or (most is not None and padded > most)
            if over or (apart is not None and apart[i]):
                runs.append(range(start, i))
                start, widest, total = i, 0, 0
        widest, total = max(widest, width), total + width
    if start < len(widths):
        runs.append(range(start, len(widths)))
    return runs
