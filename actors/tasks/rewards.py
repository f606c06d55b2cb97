"""``data.reward``: which reward a run uses, by name.

- empty: the task's own ``reward`` (with data files, the math verifier);
- ``math``: the math verifier (:mod:`.math_reward`);
- ``model:DIR``: a Hugging Face sequence classifier (:mod:`.classifier`);
- ``judge:package.module:attr``: a generative judge, ``async judge(sample, response,
  client)`` asking the policy through the generators' API (``actors/serving/judge.py``);
- ``package.module:attr``: a plug-in, ``f(sample, response) -> float``.

Whichever it is, it runs guarded by :class:`~.base.RewardFunction`: an error, a
non-number or a call past ``data.reward_timeout_s`` fails that group with the reason.
The math verifier, a plug-in and a task's own reward run in a child process, killed at
that limit (:mod:`.sandbox`); a reward model and a judge, which compute on or wait for
other processes, on a helper thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .base import RewardFunction, Task, TaskError, import_path
from .classifier import ClassifierReward, check_classifier_dir
from .datafiles import DataFiles
from .sandbox import RewardSource, SourceKind

__all__ = [
    "JUDGE_PREFIX",
    "MATH",
    "MODEL_PREFIX",
    "check_reward_choice",
    "load_judge",
    "load_reward",
]

MATH = "math"
MODEL_PREFIX = "model:"
JUDGE_PREFIX = "judge:"


def load_judge(choice: str) -> Callable[..., Any]:
    """The async function ``judge:module:attr`` names; TaskError naming the key if not."""
    function = import_path(choice.removeprefix(JUDGE_PREFIX), "data.reward")
    if not asyncio.iscoroutinefunction(function):
        raise TaskError(
            f"data.reward={choice!r}: not an async function (expected async def "
            "judge(sample, response, client) -> reward)"
        )
    return function


def load_reward(
    choice: str, task: Task | None, task_name: str, *, timeout_s: float | None = None
) -> RewardFunction:
    """The reward ``choice`` (``data.reward``) names, guarded; ``task`` is needed only
    when the choice is empty (the task's own reward)."""
    if choice == MATH or (not choice and isinstance(task, DataFiles)):
        from .math_reward import math_reward  # a data file's own reward is this too

        name = MATH if choice else task_name
        return RewardFunction(math_reward, name, timeout_s, source=RewardSource(SourceKind.MATH))
    if choice.startswith(MODEL_PREFIX):
        path = choice.removeprefix(MODEL_PREFIX)
        return RewardFunction(ClassifierReward(path), choice, timeout_s)
    if choice.startswith(JUDGE_PREFIX):
        raise TaskError(f"data.reward={choice!r}: a judge is made with the run's generators")
    return RewardFunction.load(choice, task, task_name, timeout_s=timeout_s)


def check_reward_choice(choice: str, task: Task | None, task_name: str) -> None:
    """TaskError if ``choice`` cannot be loaded; cheap (a reward model's weights stay
    where they are)."""
    if choice == MATH:
        try:
            import math_verify  # noqa: F401
        except ImportError as error:
            raise TaskError(f"data.reward='math': cannot import math_verify: {error}") from None
    elif choice.startswith(MODEL_PREFIX):
        check_classifier_dir(choice.removeprefix(MODEL_PREFIX))
    elif choice.startswith(JUDGE_PREFIX):
        load_judge(choice)
    else:
        RewardFunction.load(choice, task, task_name)
