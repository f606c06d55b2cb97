"""The embedded task: long addition, written out digit by digit, with an exact reward.

A prompt is ``"4589+123="``. The correct response adds the digits from the right, one
step per column (``digit + digit + carry = two-digit sum``), then gives the answer::

    9+3+0=12,8+2+1=11,5+1+1=07,4+0+0=04;4712

Every column costs nine characters, so a one-digit problem's response (10 or 11
characters) is about six times shorter than a six-digit one's (61): the lengths have the
long tail that asynchronous generation is for. Most problems are short (the number of
columns is drawn with weight 1/d), a few are long. ``long_task`` stretches the tail to
30 digits: responses of 11 to 302 tokens (the end-of-sequence token included), half of
them 41 or shorter.

The reward is 1.0 when the text after the last ``;`` is the right sum and 0.0 otherwise;
the written-out steps are how the model gets there, not what it is paid for.
Samples are a pure function of (split, index): the two splits draw from disjoint seeds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .base import Sample, sample_rng

__all__ = ["Arithmetic", "long_task", "solution", "task"]

_SPLIT_SEEDS = {"train": 0x5EED_0001, "validation": 0x5EED_0002}


def solution(a: int, b: int, *, carry: bool = True) -> str:
    """The written-out response for ``a + b``, without the end-of-sequence token.

    ``carry=False`` writes the same steps with a common slip: the carry is never taken to
    the next column, and the answer is each column's last digit (wrong when any column
    overflows). The warm-up teaches this habit beside the right one, for RL to unlearn.
    """
    digits_a, digits_b = str(a)[::-1], str(b)[::-1]
    columns = max(len(digits_a), len(digits_b))
    steps: list[str] = []
    answer: list[int] = []
    incoming = 0
    for i in range(columns):
        x = int(digits_a[i]) if i < len(digits_a) else 0
        y = int(digits_b[i]) if i < len(digits_b) else 0
        total = x + y + incoming
        steps.append(f"{x}+{y}+{incoming}={total:02d}")
        incoming = total // 10 if carry else 0
        answer.append(total % 10)
    if incoming:
        answer.append(incoming)
    digits = "".join(str(d) for d in reversed(answer)).lstrip("0") or "0"
    return ",".join(steps) + ";" + digits


@dataclass(frozen=True)
class Arithmetic:
    """Sums of two numbers of 1..``max_digits`` digits.

    ``long_tail=False`` draws the number of columns uniformly instead (the warm-up's data,
    so the base model has seen enough long sums to be able to do them).
    """

    max_digits: int = 6
    long_tail: bool = True
    name: str = "arithmetic"

    def sample(self, split: str, index: int) -> Sample:
        rng = sample_rng(_SPLIT_SEEDS, split, index)
        a, b = self._operands(rng)
        return Sample(prompt=f"{a}+{b}=", answer=str(a + b))

    def reward(self, sample: Sample, response: str) -> float:
        _, sep, answer = response.rpartition(";")
        return 1.0 if sep and answer.strip() == sample.answer else 0.0

    def reference(self, sample: Sample, *, carry: bool = True) -> str:
        """The correct response to ``sample``, or with the carry slip (for the warm-up)."""
        a, b = (int(part) for part in sample.prompt.rstrip("=").split("+"))
        return solution(a, b, carry=carry)

    def _operands(self, rng: random.Random) -> tuple[int, int]:
        sizes = range(1, self.max_digits + 1)
        weights = [1 / d if self.long_tail else 1.0 for d in sizes]
        longest = rng.choices(sizes, weights=weights)[0]
        other = rng.randint(1, longest)
        a, b = _number(rng, longest), _number(rng, other)
        return (a, b) if rng.random() < 0.5 else (b, a)


def _number(rng: random.Random, digits: int) -> int:
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


task = Arithmetic()
long_task = Arithmetic(max_digits=30)
"""The long-tail variant: up to 30 digits, on the ``embedded-long`` base model."""
