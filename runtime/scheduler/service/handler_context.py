"""What a request handler may use of the scheduler's state, declared once.

The handlers (membership.py, lease_requests.py, weight_requests.py, run_requests.py)
take a :class:`HandlerContext`, not the service that dispatches to them: they need only
these attributes, and the service, which imports them to dispatch, is one of these
without either module naming the other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol

from asyncrl.runtime.scheduler.core import SchedulerCore
from asyncrl.runtime.scheduler.durable import JournaledCore

from .activity import RoleActivity
from .loop_timings import LoopTimings
from .metrics import MetricsLog
from .payload_refs import RefIndex
from .reports import ReportLog
from .run_plan import RunPlan
from .step_path import StepPath
from .trace import Trace
from .waiting import WaitingWorkers
from .weight_routes import WeightRoutes

__all__ = ["HandlerContext"]


class HandlerContext(Protocol):
    """The scheduler's state as the request handlers see it (SchedulerService is one)."""

    core: SchedulerCore
    durable: JournaledCore
    plan: RunPlan
    metrics: MetricsLog
    reports: Mapping[str, ReportLog]
    trace: Trace
    routes: WeightRoutes  # the policy's versions
    critic_routes: WeightRoutes  # the learned critic's (PPO's), for the workers that follow it
    activity: RoleActivity
    path: StepPath
    step_role: str
    generator_role: str
    run_name: str
    heartbeat_interval_s: float
    max_message_bytes: int
    started_at: float
    progress_at: float
    stall_warned_at: float | None
    draining: str | None
    protocol_errors: int
    stores: dict[str, dict[str, int]]
    live_stores: dict[str, str]
    refs: RefIndex
    waiting: WaitingWorkers
    requests: Counter[str]
    timings: LoopTimings
    critic_step: dict[str, Any]  # the critic's newest step's metrics, for the next step line

    @property
    def finished(self) -> bool:
        """Every step of the run is done."""
        ...

    def drain(self, reason: str) -> None:
        """Hand out no new leases from now on, saying why."""
        ...

    def emit(self, name: str, body: dict[str, Any]) -> None:
        """Queue an event that follows from this commit's moves."""
        ...
