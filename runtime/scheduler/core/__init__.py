"""The scheduler core: a pure, deterministic state machine over the pipeline table."""

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import (
    DEFAULT_PIPELINE,
    Gate,
    GroupState,
    Pipeline,
    Role,
    Stage,
)

from .effects import Accepted, Grant, LockGranted, LockQueued, Notice, Rejected
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
