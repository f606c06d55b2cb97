"""DAPO's soft overlong punishment: a reward penalty that grows linearly over the last
tokens of the generation budget, so that the model learns to stop before the limit cuts
its answer off, without the cliff a truncated answer's zero reward would be.

The reward role (actors/roles/reward.py) adds it to every trajectory's reward; pure
numpy, since that role imports no torch.
"""

from __future__ import annotations

import numpy as np

__all__ = ["longest_turns", "overlong_penalty"]


def overlong_penalty(
    lengths: np.ndarray, max_new_tokens: int, buffer: int, factor: float
) -> np.ndarray:
    """float32 penalty (<= 0) per response of ``lengths`` tokens.

    With ``L`` a response's length and ``start = max_new_tokens - buffer``: 0 while
    ``L <= start``, then ``-(L - start) / buffer * factor``, reaching ``-factor`` at
    ``L = max_new_tokens`` and never going below it. ``buffer`` 0 turns it off (all 0).
    """
    lengths = np.asarray(lengths, np.float64)
    if buffer == 0:
        return np.zeros(lengths.shape, np.float32)
    if not 0 < buffer < max_new_tokens:
        raise ValueError(
            f"overlong buffer {buffer}: expected 0 (off) or fewer than max_new_tokens "
            f"({max_new_tokens})"
        )
    over = np.clip(lengths - (max_new_tokens - buffer), 0.0, buffer)
    # 0 - x, not -x: no -0.0 for a response inside the budget (it shows in dumps as such)
    return (0.0 - over / buffer * factor).astype(np.float32)


def longest_turns(trained: np.ndarray, owners: np.ndarray, trajectories: int) -> np.ndarray:
    """int64 ``[trajectories]``: each trajectory's longest run of consecutive model tokens.

    ``trained`` (bool ``[rows, longest]``) marks the model's own tokens of each sequence,
    ``owners`` (``[rows]``) the trajectory each belongs to. A run is one turn's generation
    (observation and tool tokens separate turns), which is what ``model.max_new_tokens``
    limits; a single-turn response is one run, its length.
    """
    trained = np.asarray(trained, bool)
    out = np.zeros(trajectories, np.int64)
    if trained.size == 0:
        return out
    position = np.arange(trained.shape[1])
    # At each token, how far back the last token that is not the model's lies.
    last_break = np.maximum.accumulate(np.where(trained, -1, position), axis=1)
    runs = (position - last_break).max(axis=1)
    np.maximum.at(out, np.asarray(owners, np.int64), runs)
    return out
