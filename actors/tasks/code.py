"""The embedded code task: write a small Python function from examples of what it returns.

A prompt shows three calls of a function of two numbers and what each returned, then
asks for the function; the response is its body, one expression::

    f(3,5)=18;f(2,4)=10;f(7,1)=14;f(a,b)=a*b+a

The reward makes a program of it, ``def f(a, b):\\n    return <response>``, and runs it
in the sandbox (:mod:`asyncrl.actors.sandbox`: its own process, no network, its own
directory, limits on time, memory, processes and output) on eight inputs: the three
shown and five hidden ones. One run per response: the program calls ``f`` on every input
and prints the results as one JSON line, which the reward compares with the expected
values. The reward is the fraction of the eight that ``f`` got right (``repr`` equal:
``6.0`` is not ``6``). A fraction rather than all-or-nothing: a response off by one
operator still agrees on some inputs, so the responses to one prompt differ in reward
more often, and a group whose rewards all match teaches nothing. Returning the shown
values by rote passes three of eight.

A program that does not run to the end (a syntax error, past its time, over a limit,
killed) scores 0, and its reason is logged. A machine that cannot give programs a
sandbox cannot run this task: the task says it needs one (``needs_sandbox``), and the
checks before a run refuse it with the reason.

The embedded model ``embedded-code`` was warmed up on demonstrations that mostly slip
on one operator (``a*b+b`` for ``a*b+a``, ``min`` for ``max``, ``//`` for ``%``): RL's
job is to find out, from the tests alone, which one the examples call for.

Samples are a pure function of (split, index); the two splits draw from disjoint seeds.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import structlog

from asyncrl.actors.sandbox import CodeLimits, CodeRun, SandboxUnavailable, run_python

from .base import Sample, sample_rng
from .errors import TaskError

__all__ = ["ALPHABET", "FUNCTIONS", "Case", "CodeReward", "CodeTask", "program", "task"]

log = structlog.get_logger("asyncrl.reward")

# Every character of a prompt or a right response: the embedded model's vocabulary.
ALPHABET = "0123456789abfmxin()+-*/%,=;"
# Each function's body, and the slip the warm-up's demonstrations make most of the time
# instead: one operator or name wrong, a function of its own that agrees on a few inputs.
FUNCTIONS: dict[str, str] = {
    "a+b": "a-b",
    "a-b": "b-a",
    "a*b": "a+b",
    "a*b+a": "a*b+b",
    "a*b-b": "a*b-a",
    "a%b": "a//b",
    "a//b": "a%b",
    "max(a,b)": "min(a,b)",
    "min(a,b)": "max(a,b)",
    "max(a,b)-b": "max(a,b)-a",
    "a*a+b": "a*a-b",
    "(a+b)*2": "a+b*2",
}
_SPLIT_SEEDS = {"train": 0xC0DE_0001, "validation": 0xC0DE_0002}
_AT_ONCE = 8  # a group's programs run together, at most this many
_CASE = re.compile(r"f\((-?\d+),(-?\d+)\)=(-?\d+)")
# Run in the sandbox with the response in place of {body}. Its last line of output is
# the results; whatever the response prints itself comes before it. The expected values
# are not in the program: printing them takes computing them.
_HARNESS = """\
def f(a, b):
    return {body}


import json as _json

_results = []
for _a, _b in {inputs}:
    try:
        _results.append(repr(f(_a, _b)))
    except Exception as _error:
        _results.append("raised " + type(_error).__name__)
print(_json.dumps(_results))
"""


class Case(NamedTuple):
    """One test: ``f(a, b)`` must return ``want``."""

    a: int
    b: int
    want: int

    def __str__(self) -> str:
        return f"f({self.a},{self.b})={self.want}"


def program(body: str, cases: list[Case]) -> str:
    """The program the sandbox runs for the response ``body``."""
    return _HARNESS.format(body=body, inputs=[(case.a, case.b) for case in cases])


@dataclass(frozen=True)
class CodeTask:
    """Functions of two numbers in 1..9 (``FUNCTIONS``), ``shown`` examples in the prompt
    and ``hidden`` more in the tests; each program's run limited to ``timeout_s``."""

    shown: int = 3
    hidden: int = 5
    timeout_s: float = 2.0
    name: str = "code"
    # Read by the checks before a run: this task's reward runs model-written code.
    needs_sandbox: ClassVar[bool] = True

    def sample(self, split: str, index: int) -> Sample:
        rng = sample_rng(_SPLIT_SEEDS, split, index)
        body = rng.choice(list(FUNCTIONS))
        pairs = rng.sample(
            [(a, b) for a in range(1, 10) for b in range(1, 10)], self.shown + self.hidden
        )
        cases = [Case(a, b, _value(body, a, b)) for a, b in pairs]
        shown = ";".join(str(case) for case in cases[: self.shown])
        return Sample(
            prompt=f"{shown};f(a,b)=",
            answer=";".join(str(case) for case in cases),
            extra_info={"reference": body},
        )

    @property
    def reward(self) -> CodeReward:
        """``reward(sample, response)``; ``reward.batch(sample, responses)`` scores a
        group, its programs running at once."""
        return CodeReward(self)

    def score(self, sample: Sample, response: str) -> float:
        """The share of the tests that ``response`` passes, run in the sandbox."""
        cases = self.cases(sample)
        source = program(response, cases)
        try:
            run = run_python(source, limits=CodeLimits(timeout_s=self.timeout_s))
        except SandboxUnavailable as error:  # the machine's fault, not the program's
            raise TaskError(
                f"task {self.name!r}: no sandbox to run the program in: {error}"
            ) from None
        passed, why = _passed(run, cases)
        if why is not None:
            # A program killed (at a limit, or by a signal) is worth a warning; one that
            # exited on an error (a syntax error, MemoryError) is a model's mistake.
            killed = run.exit_code is None or run.exit_code < 0
            say = log.warning if killed else log.info
            say("program scored 0", task=self.name, reason=why, response=response[:200])
            return 0.0
        return passed / len(cases)

    def cases(self, sample: Sample) -> list[Case]:
        """The tests in ``sample.answer``, the shown ones first."""
        cases = [Case(*map(int, found)) for found in _CASE.findall(sample.answer)]
        if len(cases) != self.shown + self.hidden:
            raise TaskError(
                f"task {self.name!r}: answer {sample.answer[:200]!r} holds {len(cases)} tests, "
                f"not {self.shown + self.hidden}"
            )
        return cases

    def demonstration(self, sample: Sample, *, slip: bool) -> str:
        """A response for the warm-up: the function's body, or with its usual slip."""
        body = str((sample.extra_info or {})["reference"])
        return FUNCTIONS[body] if slip else body


class CodeReward:
    """The code task's reward. A group's programs run at once: each waits mostly on its
    sandbox being made (processes, namespaces, mounts), which overlaps."""

    def __init__(self, task: CodeTask) -> None:
        self.task = task

    def __call__(self, sample: Sample, response: str) -> float:
        return self.task.score(sample, response)

    def batch(self, sample: Sample, responses: list[str]) -> list[float]:
        if len(responses) <= 1:
            return [self.task.score(sample, response) for response in responses]
        with ThreadPoolExecutor(min(len(responses), _AT_ONCE)) as pool:
            return list(pool.map(lambda response: self.task.score(sample, response), responses))


def _value(body: str, a: int, b: int) -> int:
    """``body`` at (a, b): the task's own expressions, so this process may evaluate them."""
    return int(eval(body, {"__builtins__": {"max": max, "min": min}}, {"a": a, "b": b}))


def _passed(run: CodeRun, cases: list[Case]) -> tuple[int, str | None]:
    """How many ``cases`` the run got right; or 0 and why it could not be judged."""
    if not run.ok:
        return 0, run.reason or "did not run to the end"
    lines = run.stdout.strip().splitlines()
    try:
        results = json.loads(lines[-1]) if lines else None
    except ValueError:
        results = None
    if not (isinstance(results, list) and len(results) == len(cases)):
        return 0, f"its last line of output is not the {len(cases)} results"
    return sum(got == repr(case.want) for got, case in zip(results, cases, strict=True)), None


task = CodeTask()
