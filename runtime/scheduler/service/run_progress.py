"""Where a run stands, shared by the service and the request handlers that move it on."""

from __future__ import annotations

from typing import Any

from .run_plan import RunPlan

__all__ = ["RunProgress"]


class RunProgress:
    """The run's plan, when it started and last stepped, whether a stall was warned of,
    the critic's newest step (for the next step's line), the newest step's
    training-inference mismatch and learning figures (for the status), and why no new
    leases are handed out, if none are."""

    def __init__(self, plan: RunPlan, started_at: float) -> None:
        self.plan = plan
        self.started_at = started_at
        self.progress_at = started_at  # the last step, or the start
        self.stall_warned_at: float | None = None
        self.critic_step: dict[str, Any] = {}  # the critic's newest step (PPO's), if any
        self.mismatch: dict[str, Any] = {}  # the newest step's logprob_mismatch_* and step
        self.learning: dict[str, Any] = {}  # the newest step's reward and entropy, and step
        self.draining: str | None = None  # why no new leases are handed out
        # why the run cannot go on (dynamic sampling found no signal for too long): it
        # drains, and the scheduler exits saying so (child_status.STOPS_THE_RUN)
        self.failure: str | None = None

    def finished(self, steps_done: int) -> bool:
        """Every step of the run is done."""
        return steps_done >= self.plan.total_steps

    def stepped(self, now: float) -> None:
        """A train step came: the run moves, no stall."""
        self.progress_at, self.stall_warned_at = now, None
