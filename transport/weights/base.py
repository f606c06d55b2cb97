"""The weight-sync contract, and the choice of strategy from the config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Announcement", "Fetched", "Plan", "WeightSync", "make_weight_sync"]


@dataclass(frozen=True)
class Announcement:
    """What a trainer hands the scheduler with version ``version``: how to fetch it.

    ``manifest`` is the strategy's description of the bytes (layout, bucket checksums), a
    MessagePack-able dict the scheduler passes on untouched; ``address`` is where the
    publisher serves them (b"" for a strategy that needs no peer, such as files).
    """

    version: int
    manifest: dict[str, object]
    address: bytes = b""


@dataclass(frozen=True)
class Plan:
    """What the scheduler tells a receiver: ``version``'s manifest and whom to pull it from.

    ``source`` is the worker serving it (the publisher, or a receiver relaying it) and
    ``source_address`` its weight-plane address.
    """

    version: int
    manifest: dict[str, object]
    source: str
    source_address: bytes = b""


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
