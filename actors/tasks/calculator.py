"""The embedded agentic task: arithmetic the model cannot do in its head, with a calculator.

A prompt is an expression with a product of multi-digit numbers, ``"34*56+12="``. The
model may call the calculator by writing an expression in brackets; the environment
answers with its value, and the model gives its answer, then ends::

    34*56+12=[34*56+12]1916;1916
             ^ model    ^ tool ^ model

The calculator's answer (``1916;``) is an observation: in the trajectory, never trained.
A call the calculator cannot read (``[34*]``) is answered ``?;``. The reward is 1.0 when
the model's final turn is the value of the expression, 0.0 otherwise.

The embedded model ``embedded-calculator`` was warmed up on demonstrations that mostly
use the tool badly: they put only the product in the brackets and give its value as the
answer (right only when the expression is the product alone, a quarter of the problems),
or guess without the tool. RL's job is to find out that the whole expression goes in.

Samples are a pure function of (split, index); the two splits draw from disjoint seeds.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from .base import Sample, sample_rng

__all__ = ["ALPHABET", "Calculator", "CalculatorTask", "evaluate", "task"]

ALPHABET = "0123456789+-*=[];?"
_SPLIT_SEEDS = {"train": 0xCA1C_0001, "validation": 0xCA1C_0002}
# The product alone (a quarter of the problems), or followed by a sum or a difference.
# Only the first is right when the tool gets just the product.
_FORMS = ("{p}", "{p}+{c}", "{p}-{c}")
_FORM_WEIGHTS = (2, 3, 3)
_EXPRESSION = re.compile(r"\d{1,7}([+\-*]\d{1,7}){0,4}")


def evaluate(expression: str) -> int | None:
    """The value of ``digits (op digits)*`` with ``*`` before ``+``/``-``; None if the text
    is not such an expression (the calculator reads nothing else)."""
    if not _EXPRESSION.fullmatch(expression):
        return None
    total, term, sign = 0, None, 1
    for token in re.findall(r"\d+|[+\-*]", expression):
        if token == "*":
            continue
        if token in "+-":
            total += sign * term
            sign, term = (1 if token == "+" else -1), None
        elif term is None:
            term = int(token)
        else:
            term *= int(token)  # the previous token was "*"
    return total + sign * term


@dataclass(frozen=True)
class CalculatorTask:
    name: str = "calculator"

    def sample(self, split: str, index: int) -> Sample:
        rng = sample_rng(_SPLIT_SEEDS, split, index)
        a, b = rng.randint(10, 999), rng.randint(10, 99)
        if rng.random() < 0.5:
            a, b = b, a
        form = rng.choices(_FORMS, weights=_FORM_WEIGHTS)[0]
        c = rng.randint(1, 99 if form == "{p}-{c}" else 999)  # no negative answers
        expression = form.format(p=f"{a}*{b}", c=c)
        return Sample(prompt=f"{expression}=", answer=str(evaluate(expression)))

    def reward(self, sample: Sample, response: str) -> float:
        """Single-turn scoring of a final answer (the environment pays the same)."""
        return 1.0 if response.strip() == sample.answer else 0.0

    def demonstration(self, sample: Sample, habit: str) -> list[tuple[str, bool]]:
        """A trajectory in parts (text, the model's?) for the warm-up: ``full`` calls the
        tool with the whole expression, ``product`` with the product only and answers its
        value, ``guess`` answers without the tool (a number of about the right size)."""
        expression = sample.prompt.rstrip("=")
        if habit == "guess":
            rng = random.Random(expression)
            return [(str(rng.randint(1, 10 ** len(sample.answer))), True)]
        called = expression if habit == "full" else re.search(r"\d+\*\d+", expression)[0]
        value = str(evaluate(called))
        return [(f"[{called}]", True), (f"{value};", False), (value, True)]


class Calculator:
    """The environment: one per trajectory. A turn ending in ``]`` is a calculator call;
    any other turn is the final answer, which ends the episode with its reward."""

    stop = ("]",)

    def reset(self, sample: Sample) -> str:
        self.answer = sample.answer
        return sample.prompt

    def step(self, action: str) -> tuple[str, float, bool]:
        if action.endswith("]"):
            _, bracket, expression = action[:-1].rpartition("[")
            value = evaluate(expression) if bracket else None
            return ("?;" if value is None else f"{value};"), 0.0, False
        return "", 1.0 if action.strip() == self.answer else 0.0, True


task = CalculatorTask()
