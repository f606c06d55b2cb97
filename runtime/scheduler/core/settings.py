"""The scheduler core's settings: the scheduler's part of a run's configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .fences import FenceCipher

if TYPE_CHECKING:
    from asyncrl.runtime.contract.config import RunConfig

__all__ = ["CoreSettings"]


@dataclass(frozen=True, slots=True)
class CoreSettings:
    max_staleness: int = 1
    train_batch_groups: int = 8
    max_attempts: int = 3
    lease_timeout: float = 60.0
    worker_timeout: float = 15.0
    resources: Mapping[str, int] = field(default_factory=dict)
    # Dynamic sampling's bound: more groups than this filtered in a row, none judged to
    # carry signal between, and the run stops (nothing it generates carries signal).
    # 0: no bound (filtering is off, or a test wants none).
    max_filtered_in_a_row: int = 0
    # Keys the fences (fences.py): from the run's secret, so that a resumed scheduler
    # issues the same tokens. Empty: fences are plain counts (unit tests).
    fence_key: bytes = field(default=b"", repr=False)

    def fences(self) -> FenceCipher:
        return FenceCipher(self.fence_key)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> CoreSettings:
        """The scheduler's part of a run's configuration."""
        pipeline, scheduler = cfg.pipeline, cfg.scheduler
        rule = cfg.algorithm.filter_groups
        return cls(
            max_staleness=pipeline.max_staleness,
            train_batch_groups=pipeline.train_batch_groups,
            max_attempts=pipeline.max_attempts,
            lease_timeout=pipeline.lease_timeout_s,
            worker_timeout=scheduler.worker_timeout_s,
            resources=dict(scheduler.resources),
            max_filtered_in_a_row=(
                rule.max_filtered_batches * pipeline.train_batch_groups if rule.enabled else 0
            ),
        )
