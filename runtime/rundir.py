"""Where a run keeps its files. Every process finds them through this one layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunDir"]


@dataclass(frozen=True, slots=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        """The resolved configuration the run was started with."""
        return self.root / "config.yaml"

    @property
    def journal(self) -> Path:
        return self.root / "journal"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def validation(self) -> Path:
        return self.root / "validation.jsonl"

    @property
    def weight_loads(self) -> Path:
        """Each generator's report of each weight version it fetched and loaded."""
        return self.root / "weights.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"
