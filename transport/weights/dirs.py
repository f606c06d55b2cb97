"""Where the weight plane's strategies keep files, as the caller says (factory.py).

A module of its own, free of torch: the launcher reads these directories to sweep what a
run left in them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["WeightDirs"]


@dataclass(frozen=True, slots=True)
class WeightDirs:
    """Where strategies keep files: ``files`` for the files strategy's versions, ``shared``
    for slot files that generators on the trainer's host map (shm, or ucx with
    ``map_on_host``)."""

    files: Path
    shared: Path

    def of_rank(self, rank: int) -> WeightDirs:
        """Where rank ``rank`` of a group keeps its part of each version (parts.py):
        inside these directories, never in them (a publisher starting on a directory
        removes the slot files nobody holds)."""
        return WeightDirs(self.files / f"rank-{rank}", self.shared / f"rank-{rank}")
