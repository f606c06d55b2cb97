"""The task contract, and loading a task plug-in by import path."""

from __future__ import annotations

import importlib
import math
import numbers
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .deadline import Deadline, DeadlineExceeded
from .errors import TaskError
from .sandbox import RewardSource, Sandbox, SourceKind

__all__ = [
    "RewardFunction",
    "Sample",
    "Task",
    "TaskError",
    "check_reward",
    "import_path",
    "load_task",
    "sample_rng",
]


@dataclass(frozen=True, slots=True)
class Sample:
    """One prompt, with what the reward function needs to score a response to it."""

    prompt: str
    answer: str  # the reference the reward compares against; never shown to the model
    data_source: str = ""  # a data file row's: which dataset it came from
    extra_info: Mapping[str, Any] | None = None  # a data file row's own extras
    # A data file row's chat messages, before the chat template made ``prompt`` of them
    # (what an agent harness sends to /v1/chat/completions)
    messages: tuple[Mapping[str, Any], ...] | None = None


@runtime_checkable
class Task(Protocol):
    """What a task plug-in provides. Samples are a pure function of (split, index).

    A task whose reward runs model-written code says so with ``needs_sandbox = True``: a
    run on a machine that cannot give that code a sandbox (:mod:`asyncrl.actors.sandbox`)
    is then refused before it starts."""

    name: str

    def sample(self, split: str, index: int) -> Sample:
        """The ``index``-th sample of ``split`` ("train" or "validation"); deterministic.
        A finite validation split raises IndexError past its end."""
        ...

    def reward(self, sample: Sample, response: str) -> float:
        """Score ``response`` to ``sample`` (a finite number, usually in [0, 1])."""
        ...


def sample_rng(seeds: Mapping[str, int], split: str, index: int) -> random.Random:
    """The random draws of sample ``index`` of ``split``: a pure function of the two, each
    split from its own seed (disjoint splits). ValueError naming a bad split or index."""
    if split not in seeds:
        raise ValueError(f"split {split!r}: expected one of {sorted(seeds)}")
    if index < 0:
        raise ValueError(f"index {index}: expected an integer >= 0")
    return random.Random(seeds[split] * 1_000_003 + index)


def load_task(path: str) -> Task:
    """The task at ``path`` (``package.module:attr``), checked against :class:`Task`."""
    task = import_path(path, "data.task")
    if not isinstance(task, Task):
        missing = [name for name in ("name", "sample", "reward") if not hasattr(task, name)]
        raise TaskError(f"data.task={path!r}: not a task (missing {', '.join(missing)})")
    return task


class RewardFunction:
    """The reward in use, guarded: a plug-in that raises, returns a non-number or runs
    past ``timeout_s`` is a TaskError naming the plug-in, which fails the group it was
    scoring, not the run. With a ``source`` (where a fresh process finds the function),
    calls run in a child process killed at the time limit (:mod:`.sandbox`); without one,
    with a time limit, on a helper thread, which a call that holds the GIL outlives."""

    def __init__(
        self,
        function: Callable[[Sample, str], Any],
        name: str,
        timeout_s: float | None = None,
        *,
        source: RewardSource | None = None,
    ) -> None:
        self.function = function
        self.name = name
        self.deadline = Deadline(timeout_s)
        self.sandbox = None if source is None else Sandbox(source, name, timeout_s)

    @classmethod
    def load(
        cls,
        reward_path: str,
        task: Task | None,
        task_path: str,
        *,
        timeout_s: float | None = None,
    ) -> RewardFunction:
        """``data.reward``'s function, or the task's own when that key is empty (the only
        case that needs ``task``)."""
        if not reward_path:
            if task is None:
                raise TaskError(f"{task_path}: the task's own reward needs the task loaded")
            # In a child process only if one finds the same task at ``task_path``.
            found = _names(task_path, task)
            source = RewardSource(SourceKind.TASK, task_path) if found else None
            return cls(task.reward, task_path, timeout_s, source=source)
        function = import_path(reward_path, "data.reward")
        if not callable(function):
            raise TaskError(f"data.reward={reward_path!r}: not callable")
        source = RewardSource(SourceKind.FUNCTION, reward_path)
        return cls(function, reward_path, timeout_s, source=source)

    @property
    def killed(self) -> int:
        """Calls that ran past the time limit in a child process, killed with it."""
        return 0 if self.sandbox is None else self.sandbox.killed

    @property
    def stuck(self) -> int:
        """Calls that ran past the time limit and are still running (on threads left
        behind)."""
        return self.deadline.stuck

    def close(self) -> None:
        """End the child process, if calls run in one."""
        if self.sandbox is not None:
            self.sandbox.close()

    def __call__(self, sample: Sample, response: str) -> float:
        if self.sandbox is not None:
            return self.sandbox.score(sample, [response])[0]
        return check_reward(self._guarded(self.function, sample, response), task=self.name)

    def score_all(self, sample: Sample, responses: Sequence[str]) -> list[float]:
        """Every response to ``sample``: in one call if the function has a ``batch(sample,
        responses)`` method (a reward model scores them as one batch), else one by one."""
        batch = getattr(self.function, "batch", None)
        if not callable(batch):
            return [self(sample, response) for response in responses]
        if self.sandbox is not None:
            return self.sandbox.score(sample, list(responses))
        values = self._guarded(batch, sample, list(responses))
        if not isinstance(values, Sequence) or len(values) != len(responses):
            got = len(values) if isinstance(values, Sequence) else type(values).__name__
            raise TaskError(f"reward {self.name!r}: batch gave {got} for {len(responses)}")
        return [check_reward(value, task=self.name) for value in values]

    def _guarded(self, function: Callable[..., Any], *args: Any) -> Any:
        try:
            return self.deadline.call(function, *args)
        except DeadlineExceeded as error:
            raise TaskError(f"reward {self.name!r} did not return: {error}") from None
        except Exception as error:
            detail = f"{type(error).__name__}: {error}"
            raise TaskError(f"reward {self.name!r} raised {detail}") from error


def check_reward(value: Any, *, task: str) -> float:
    """``value`` as a float, or a TaskError saying what the reward function returned."""
    if not isinstance(value, numbers.Real):
        raise TaskError(f"reward {task!r} returned {type(value).__name__}, not a number")
    if not math.isfinite(value):
        raise TaskError(f"reward {task!r} returned {value!r}, not a finite number")
    return float(value)


def _names(path: str, task: Task) -> bool:
    """Whether ``path`` is an import path that names ``task`` itself."""
    try:
        return import_path(path, "data.task") is task
    except TaskError:
        return False


def import_path(path: str, key: str) -> Any:
    """The attribute at ``path`` (``package.module:attr``); a TaskError naming ``key``."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TaskError(f"{key}={path!r}: expected an import path 'package.module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise TaskError(f"{key}={path!r}: cannot import {module_name!r}: {error}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TaskError(f"{key}={path!r}: {module_name!r} has no attribute {attr!r}") from None
