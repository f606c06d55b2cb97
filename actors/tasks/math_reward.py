"""The math verifier (``data.reward: math``, the default for data files), by math-verify.

The response's final answer is its last ``\\boxed{...}``, or, without one, the last
number in it (``-3``, ``0.75``, ``3/4``, ``1,000``); it earns 1.0 when math-verify finds
it equal to the ground truth (``\\frac{1}{2}`` equals ``0.5``), else 0.0. A response
with no answer earns 0.0; a ground truth that does not parse is an error (it fails the
group with the reason), since every response to it would score 0 without telling why.

math-verify's own timeouts use ``signal.alarm``, which only the main thread may set;
they are off here. :class:`~.base.RewardFunction` bounds the whole call instead, in a
child process it kills at the limit (:mod:`.sandbox`): a response can make the verifier
compute for ever in one call that holds the GIL (``\\boxed{9^{9^{9^{9}}}}``).
"""

from __future__ import annotations

import re
from typing import Any

from .base import Sample, TaskError

__all__ = ["final_answer", "math_reward"]

# A number: thousands in groups of three (1,000) or plain digits, then a decimal part or
# a denominator. A lone "," between digits otherwise separates two numbers.
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?(?:/\d+)?")
_BOXED = "\\boxed{"


def math_reward(sample: Sample, response: str) -> float:
    """1.0 if the response's final answer equals ``sample.answer`` mathematically."""
    from math_verify import verify  # sympy underneath: imported by runs that use it

    # Boxed, as verl's verifier does: a bare LaTeX truth ("x^2+1") parses only inside a
    # math environment.
    truth = sample.answer if _BOXED in sample.answer else f"{_BOXED}{sample.answer}}}"
    gold = _parse(truth, latex=True)
    if not gold:
        raise TaskError(f"ground truth {sample.answer!r} does not parse as math")
    answer = final_answer(response)
    if answer is None:
        return 0.0
    parsed = _parse(answer, latex=answer.startswith(_BOXED))
    return 1.0 if parsed and verify(gold, parsed, timeout_seconds=None) else 0.0


def final_answer(response: str) -> str | None:
    """The last ``\\boxed{...}`` (whole, braces balanced), else the last number, else None."""
    boxed = _last_boxed(response)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(response)
    return numbers[-1].replace(",", "") if numbers else None


def _last_boxed(text: str) -> str | None:
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth = 0
    for end in range(start + len(_BOXED) - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start : end + 1]
    return None  # never closed (cut off inside its answer): the last number will do


def _parse(text: str, *, latex: bool) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    configs = [LatexExtractionConfig(boxed_match_priority=0)] if latex else []
    return parse(text, extraction_config=[*configs, ExprExtractionConfig()], parsing_timeout=None)
