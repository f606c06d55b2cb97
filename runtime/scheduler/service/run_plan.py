"""How much work a run has: the steps, the groups, and how many may wait to be generated."""

from __future__ import annotations

__all__ = ["RunPlan"]


class RunPlan:
    """How much work the run has and how much may wait in the entry state."""

    def __init__(self, total_steps: int, batch_groups: int, max_staleness: int) -> None:
        self.total_steps = total_steps
        self.total_groups = total_steps * batch_groups
        # Enough queued prompts for every generator to be busy up to the staleness bound.
        self.backlog = batch_groups * (max_staleness + 2)
