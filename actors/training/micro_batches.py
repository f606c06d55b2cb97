"""How a step's rows are cut into micro-batches, and which of them each rank runs; the
same for the trainer and the critic (the loss is normalised over the whole step, so how
rows are cut does not change it)."""

from __future__ import annotations

import numpy as np
import torch

from ..policy.padding import like_width_runs
from .group import Group

__all__ = ["MICRO_BATCH_SLACK", "by_length", "rank_passes", "stacked"]

# A micro-batch takes the next row (of the step's, longest first) while padding it to its
# longest costs at most this many times its tokens (see by_length).
MICRO_BATCH_SLACK = 1.1


def by_length(groups: list[Group], advantages: list[np.ndarray], per_micro: int):
    """The step's rows, longest first, in micro-batches of like length, each a list of row
    sets of groups and their ``[rows, longest]`` advantages.

    A micro-batch is padded to its longest row; it takes the next row while that padding
    stays within :data:`MICRO_BATCH_SLACK` of its tokens, and never holds more padded
    tokens than ``per_micro`` groups' rows of the step's longest would (the memory the
    setting asks for). Measured on one CPU thread with 6 steps of the long-tail task's
    responses (64 rows of up to 320 tokens): 1.08 padded tokens a token in about 8
    micro-batches and 0.54 s a step, against 1.45 in 4 of equal rows and 0.67 s.
    """
    rows = [
        (len(g.rollouts.prompt_ids) + int(length), i, row)
        for i, g in enumerate(groups)
        for row, length in enumerate(g.rollouts.lengths)
    ]
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    count = -(-len(groups) // per_micro)
    most = -(-len(rows) // count) * rows[0][0]
    batches = []
    for run in like_width_runs([r[0] for r in rows], MICRO_BATCH_SLACK, most=most):
        taken: dict[int, list[int]] = {}
        for _, i, row in (rows[k] for k in run):
            taken.setdefault(i, []).append(row)
        chosen = {i: np.array(sorted(r)) for i, r in sorted(taken.items())}
        parts = [groups[i].rows(c) for i, c in chosen.items()]
        cut = [
            advantages[i][c, : part.rollouts.response_ids.shape[1]]
            for (i, c), part in zip(chosen.items(), parts, strict=True)
        ]
        batches.append((parts, cut))
    return batches


def stacked(arrays: list[np.ndarray], width: int) -> torch.Tensor:
    """``[n, longest]`` arrays stacked into ``[rows, width]`` (zero padded)."""
    out = torch.zeros(sum(a.shape[0] for a in arrays), width)
    row = 0
    for a in arrays:
        out[row : row + a.shape[0], : a.shape[1]] = torch.tensor(a)  # a copy: frames are read-only
        row += a.shape[0]
    return out


def rank_passes(batches: list, part: int, parts: int) -> list:
    """The micro-batches copy ``part`` of ``parts`` runs: batch m goes to copy m mod parts;
    every copy makes as many passes as the busiest, a pass beyond its own share repeating
    the last (shortest) batch and not real (its loss counts 0), so that collectives pair
    up. Each pass is ``(*batch, real)``."""
    mine = batches[part::parts]
    passes = -(-len(batches) // parts)
    return [
        (*mine[index], True) if index < len(mine) else (*batches[-1], False)
        for index in range(passes)
    ]
