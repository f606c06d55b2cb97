"""The scheduler core: a pure, deterministic state machine over the pipeline table."""

from .effects import Accepted, Grant, LockGranted, LockQueued, Notice, Reason, Rejected
from .pipeline import DEFAULT_PIPELINE, Gate, GroupState, Pipeline, Role, Stage
from .scheduler import SchedulerCore
from .settings import CoreSettings

__all__ = [
    "DEFAULT_PIPELINE",
    "Accepted",
    "CoreSettings",
    "Gate",
    "Grant",
    "GroupState",
    "LockGranted",
    "LockQueued",
    "Notice",
    "Pipeline",
    "Reason",
    "Rejected",
    "Role",
    "SchedulerCore",
    "Stage",
]
