"""Which groups of a train step's batch each optimizer step of it takes.

A batch of G groups makes ``mini_batches`` x ``epochs`` optimizer steps: each epoch is a
permutation of the groups cut into ``mini_batches`` runs of G / mini_batches groups. The
permutation depends on the run's seed, the step and the epoch alone, so every rank of a
group, and a trainer restarted at this step, computes the same split. With one mini-batch
the groups stay in their lease's order (the one update is then the whole batch, exactly as
without mini-batches). Within a mini-batch the groups keep their lease's order, so how the
mini-batch is cut into micro-batches does not depend on the shuffle.
"""

from __future__ import annotations

import numpy as np

__all__ = ["mini_batch_groups"]


def mini_batch_groups(
    groups: int, mini_batches: int, epochs: int, *, seed: int, step: int
) -> list[list[int]]:
    """The group indices of each optimizer step, in the order they are taken (epoch by
    epoch); ``step``: the train steps taken before this one."""
    if groups % mini_batches:
        raise ValueError(
            f"a batch of {groups} groups does not split into algorithm.mini_batches="
            f"{mini_batches} mini-batches of equal size"
        )
    size = groups // mini_batches
    out: list[list[int]] = []
    for epoch in range(epochs):
        if mini_batches == 1:
            order = np.arange(groups)
        else:
            order = np.random.default_rng([seed, step, epoch]).permutation(groups)
        for m in range(mini_batches):
            out.append(sorted(int(i) for i in order[m * size : (m + 1) * size]))
    return out
