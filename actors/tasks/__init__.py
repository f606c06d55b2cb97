"""Tasks: where prompts come from and how a response is scored.

A task is a plug-in named by import path (``data.task: package.module:attr``); the
attribute is an object that satisfies :class:`Task`. The embedded default is
:mod:`asyncrl.actors.tasks.arithmetic`; data files in verl's layout are
:mod:`asyncrl.actors.tasks.datafiles`. Rewards: the task's own, a plug-in, or one of
:mod:`asyncrl.actors.tasks.rewards`' (the math verifier, a sequence classifier).
"""

from .base import (
    RewardFunction,
    Sample,
    Task,
    TaskError,
    check_reward,
    load_task,
)

__all__ = [
    "RewardFunction",
    "Sample",
    "Task",
    "TaskError",
    "check_reward",
    "load_task",
]
