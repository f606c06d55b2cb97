"""Task plug-ins for tests: the arithmetic task with a reward function that misbehaves."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.actors.tasks import Sample
from asyncrl.actors.tasks.arithmetic import Arithmetic

_BASE = Arithmetic()


@dataclass(frozen=True)
class Misbehaving:
    """Arithmetic, but the reward raises for sums ending in 3 and returns text for 7."""

    name: str = "misbehaving"

    def sample(self, split: str, index: int) -> Sample:
        return _BASE.sample(split, index)

    def reward(self, sample: Sample, response: str) -> float:
        if sample.answer.endswith("3"):
            raise ZeroDivisionError("the plug-in's own bug")
        if sample.answer.endswith("7"):
            return "seven"  # type: ignore[return-value]
        return _BASE.reward(sample, response)


misbehaving = Misbehaving()


def raising_reward(sample: Sample, response: str) -> float:
    """A reward plug-in (``data.reward``) with a bug for odd sums."""
    if int(sample.answer) % 2:
        raise KeyError("the plug-in's own bug")
    return 1.0 if response.endswith(sample.answer) else 0.0


def digits_reward(sample: Sample, response: str) -> float:
    """A reward plug-in that even a random model earns some of: the share of digits in its
    response. Responses of one group differ, so advantages are not all zero and the
    weights move."""
    return sum(c.isdigit() for c in response) / max(1, len(response))


def sevens_reward(sample: Sample, response: str) -> float:
    """A reward plug-in a random model earns little of (about one token in the alphabet's
    17): the share of sevens in its response. A run that learns raises it quickly."""
    return response.count("7") / max(1, len(response))


def sleepy_reward(sample: Sample, response: str) -> float:
    """A reward plug-in that hangs for a while on sums ending in 3 (past any short limit)."""
    if sample.answer.endswith("3"):
        import time

        time.sleep(2.0)
    return 1.0 if response.endswith(sample.answer) else 0.0


def half_signal_reward(sample: Sample, response: str) -> float:
    """A reward plug-in under which half the prompts carry no signal: every response to a
    prompt with an even sum is paid 0.5 alike (dynamic sampling filters those), the rest
    the share of digits in the response."""
    if int(sample.answer) % 2 == 0:
        return 0.5
    return digits_reward(sample, response)


def constant_reward(sample: Sample, response: str) -> float:
    """A reward plug-in that pays every response the same: no group carries a signal."""
    return 1.0
