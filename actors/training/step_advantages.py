"""A step's advantages, per group and token, under the run's estimator.

The estimators (actors/rl) work on the step as one batch: REINFORCE++ and GAE whiten over
every model token of the step, so the groups are laid side by side, estimated together
and cut back into each group's ``[rows, longest]`` layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from asyncrl.runtime.contract.config import AlgorithmSection

from ..payloads import RolloutsOut
from ..rl import Estimate, estimate_advantages

__all__ = ["step_advantages"]


def step_advantages(
    rollouts: Sequence[RolloutsOut],
    rewards: Sequence[np.ndarray],
    algorithm: AlgorithmSection,
    values: Sequence[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """Each group's float32 ``[rows, longest]`` advantages (0 off its model tokens), and,
    under ``gae``, each group's returns (the critic's targets) alike.

    ``rewards[i]`` is group ``i``'s ``[n]`` trajectory rewards; ``values[i]``, needed by
    ``gae`` alone, the critic's ``[rows, longest]`` values of group ``i``.
    """
    masks = [r.trained_mask() for r in rollouts]
    estimate = estimate_advantages(
        algorithm.estimator,
        torch.from_numpy(np.stack(rewards).astype(np.float32)),
        torch.from_numpy(np.concatenate([np.full(len(m), i) for i, m in enumerate(masks)])),
        torch.from_numpy(np.concatenate([r.owners for r in rollouts]).astype(np.int64)),
        torch.from_numpy(_side_by_side(masks, bool)),
        gamma=algorithm.gamma,
        lam=algorithm.lam,
        values=None if values is None else torch.from_numpy(_side_by_side(values, np.float32)),
    )
    return _cut(estimate.advantages, masks), _returns(estimate, masks)


def _side_by_side(arrays: Sequence[np.ndarray], dtype) -> np.ndarray:
    """``[rows, longest]`` arrays stacked into one ``[all rows, widest]``, zero padded."""
    out = np.zeros((sum(len(a) for a in arrays), max(a.shape[1] for a in arrays)), dtype)
    row = 0
    for a in arrays:
        out[row : row + len(a), : a.shape[1]] = a
        row += len(a)
    return out


def _cut(batch: torch.Tensor, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``batch`` back into arrays shaped as ``like``'s, float32."""
    out, row = [], 0
    for a in like:
        out.append(batch[row : row + len(a), : a.shape[1]].to(torch.float32).numpy())
        row += len(a)
    return out


def _returns(estimate: Estimate, masks: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    return None if estimate.returns is None else _cut(estimate.returns, masks)
