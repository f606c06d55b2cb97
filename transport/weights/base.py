"""The weight-sync contract, and the choice of strategy from the config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Fetched", "WeightSync", "make_weight_sync"]


@dataclass(frozen=True)
class Fetched:
    """One version's weights as a receiver got them, with what it cost."""

    version: int
    state: dict[str, torch.Tensor]
    nbytes: int
    seconds: float  # from asking to holding every tensor


@runtime_checkable
class WeightSync(Protocol):
    """Publish a version on the trainer's side; fetch it on a receiver's side."""

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Make ``version``'s ``state`` fetchable before the scheduler announces it."""
        ...

    def fetch(self, version: int) -> Fetched | None:
        """``version``'s weights, or None if it is no longer (or not yet) available."""
        ...

    def close(self) -> None: ...


def make_weight_sync(strategy: str, run_dir: Path) -> WeightSync:
    """The strategy named by ``weights.strategy`` for the run in ``run_dir``."""
    if strategy == "files":
        from .files import FileWeightSync

        return FileWeightSync(run_dir / "weights")
    raise ValueError(f"weights.strategy={strategy!r}: expected 'files'")
