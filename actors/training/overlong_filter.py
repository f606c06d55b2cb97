"""Overlong filtering (DAPO, ``algorithm.overlong_filter``): a truncated response gives
no loss.

A response a length limit cut off is neither right nor wrong for what it says: its
reward punishes the model for a length it was never allowed to finish. Its rows are taken
out of the step after the advantages are estimated, so its group's baseline still counts
its reward (as DAPO does: the advantages of the others do not change), while its tokens
are in neither the loss nor the token and sequence counts the loss is normalised by.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .group import Group

__all__ = ["without_truncated"]


def without_truncated(
    groups: Sequence[Group], advantages: Sequence[np.ndarray]
) -> tuple[list[Group], list[np.ndarray]]:
    """``groups`` and their ``[rows, longest]`` advantages without the rows of truncated
    trajectories (every sequence of a trajectory one of whose sequences was truncated: a
    harness session is one response); a group left with none is left out."""
    kept_groups, kept_advantages = [], []
    for group, advantage in zip(groups, advantages, strict=True):
        r = group.rollouts
        cut_off = np.unique(r.owners[r.truncated != 0])
        finished = np.flatnonzero(~np.isin(r.owners, cut_off))
        if len(finished) == len(r.owners):
            kept_groups.append(group)
            kept_advantages.append(advantage)
        elif len(finished):
            cut = group.rows(finished)
            kept_groups.append(cut)
            kept_advantages.append(advantage[finished, : cut.rollouts.response_ids.shape[1]])
    return kept_groups, kept_advantages
