"""The multi-turn environment contract, and loading an environment plug-in by import path.

An environment turns one sample into an episode of turns::

    class Calculator:
        stop = ("]",)                       # optional: texts that end a model turn
        def reset(self, sample) -> str: ... # the first observation (the prompt)
        def step(self, action) -> tuple[str, float, bool]:
            ...                             # (observation, reward part, done)

``data.environment`` names a class or factory (``package.module:attr``) called with no
arguments once per trajectory, so an episode's state lives on its own instance. A model
turn ends at end-of-sequence or at one of ``stop`` (each must be one token of the
model's vocabulary); ``step`` gets the turn's text and answers with what the model sees
next, what that turn earned and whether the episode is over. The trajectory's reward is
the sum of what its steps earned.

Calls run on worker threads, each under a time limit: a call that raises, runs past the
limit or returns something else than ``(str, finite number, bool)`` is an
:class:`EnvironmentFailed` naming the plug-in and what went wrong, which fails the group
the episode belongs to, never the run.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .base import Sample, TaskError, import_path

__all__ = [
    "Environment",
    "EnvironmentFailed",
    "StepResult",
    "check_reset",
    "check_step",
    "load_environment",
    "stop_ids",
]


class EnvironmentFailed(TaskError):
    """An environment that raised, hung or broke its contract: its group fails."""


@runtime_checkable
class Environment(Protocol):
    def reset(self, sample: Sample) -> str: ...

    def step(self, action: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class StepResult:
    observation: str
    reward: float
    done: bool


def load_environment(path: str) -> Callable[[], Environment]:
    """The factory at ``path``, checked by making one environment."""
    factory = import_path(path, "data.environment")
    if not callable(factory):
        raise TaskError(f"data.environment={path!r}: not callable (a class or a factory)")
    try:
        made = factory()
    except Exception as error:
        raise TaskError(
            f"data.environment={path!r}: making one raised {type(error).__name__}: {error}"
        ) from error
    if not isinstance(made, Environment):
        missing = [name for name in ("reset", "step") if not callable(getattr(made, name, None))]
        raise TaskError(f"data.environment={path!r}: not an environment (no {', '.join(missing)})")
    stop = getattr(made, "stop", ())
    if not isinstance(stop, tuple | list) or not all(isinstance(s, str) and s for s in stop):
        raise TaskError(f"data.environment={path!r}: stop must be a tuple of non-empty texts")
    return factory


def stop_ids(environment: Environment, encode: Callable[[str], list[int]]) -> frozenset[int]:
    """The environment's turn-ending texts as the tokens they must each be."""
    ids = set()
    for text in getattr(environment, "stop", ()):
        encoded = encode(text)
        if len(encoded) != 1:
            raise TaskError(
                f"data.environment: stop text {text!r} is {len(encoded)} tokens of the "
                "model's vocabulary; a turn can end only at a single token"
            )
        ids.add(encoded[0])
    return frozenset(ids)


def check_step(value: Any, name: str) -> StepResult:
    """``step``'s answer as a :class:`StepResult`, or an error saying what it returned."""
    if not (isinstance(value, tuple | list) and len(value) == 3):
        raise EnvironmentFailed(
            f"environment {name!r}: step returned {_describe(value)}, "
            "not (observation, reward, done)"
        )
    observation, reward, done = value
    if not isinstance(observation, str):
        raise EnvironmentFailed(
            f"environment {name!r}: step's observation is {type(observation).__name__}, not str"
        )
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
        raise EnvironmentFailed(
            f"environment {name!r}: step's reward is {type(reward).__name__}, not a number"
        )
    if not math.isfinite(reward):
        raise EnvironmentFailed(f"environment {name!r}: step's reward is {reward!r}")
    if not isinstance(done, bool):
        raise EnvironmentFailed(
            f"environment {name!r}: step's done is {type(done).__name__}, not bool"
        )
    return StepResult(observation, float(reward), done)


def check_reset(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise EnvironmentFailed(
            f"environment {name!r}: reset returned {_describe(value)}, not a non-empty str"
        )
    return value


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
