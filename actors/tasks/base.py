"""The task contract, and loading a task plug-in by import path."""

from __future__ import annotations

import importlib
import math
import numbers
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["Sample", "Task", "TaskError", "check_reward", "load_task", "score"]


class TaskError(ValueError):
    """A task plug-in that cannot be loaded, or that broke its contract."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One prompt, with what the reward function needs to score a response to it."""

    prompt: str
    answer: str  # the reference the reward compares against; never shown to the model


@runtime_checkable
class Task(Protocol):
    """What a task plug-in provides. Samples are a pure function of (split, index)."""

    name: str

    def sample(self, split: str, index: int) -> Sample:
        """The ``index``-th sample of ``split`` ("train" or "validation"); deterministic."""
        ...

    def reward(self, sample: Sample, response: str) -> float:
        """Score ``response`` to ``sample`` (a finite number, usually in [0, 1])."""
        ...


def load_task(path: str) -> Task:
    """The task at ``path`` (``package.module:attr``), checked against :class:`Task`."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TaskError(f"data.task={path!r}: expected an import path 'package.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise TaskError(f"data.task={path!r}: cannot import {module_name!r}: {error}") from None
    try:
        task = getattr(module, attr)
    except AttributeError:
        raise TaskError(f"data.task={path!r}: {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(task, Task):
        missing = [name for name in ("name", "sample", "reward") if not hasattr(task, name)]
        raise TaskError(f"data.task={path!r}: not a task (missing {', '.join(missing)})")
    return task


def check_reward(value: Any, *, task: str) -> float:
    """``value`` as a float, or a TaskError saying what the reward function returned."""
    if not isinstance(value, numbers.Real):
        raise TaskError(f"task {task!r}: reward returned {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise TaskError(f"task {task!r}: reward returned {value!r}, not a finite number")
    return float(value)


def score(task: Task, path: str, sample: Sample, response: str) -> float:
    """``task``'s reward for ``response``; a TaskError naming ``path`` if the plug-in fails."""
    try:
        value = task.reward(sample, response)
    except Exception as error:
        raise TaskError(f"task {path!r}: reward raised {type(error).__name__}: {error}") from error
    return check_reward(value, task=path)
