"""A validation pass's scores, summarized per data source and overall.

Every prompt gets k samples. Per set and overall: the mean reward over every sample
(mean@k: pass@1 averaged over the k, for a 0/1 reward), the mean over prompts of the best
of its k, pass@j for the j of :func:`~.passk.pass_ks` (a sample counts as correct when its
reward reaches ``threshold``), and the mean response length in tokens. A sample that could
not be scored (its episode or reward call failed) counts as reward 0, incorrect, and is
counted in ``val_reward_errors``. The overall figures weigh every prompt alike, whichever
set it is in.

The keys (``val_*``, and ``val_by_source`` per set) are those of ``validation.jsonl`` and
of ``asyncrl eval``'s ``eval.jsonl``; the report reads them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .passk import mean_pass_at_k, pass_ks
from .sets import ValidationSet

__all__ = ["Scores", "table_text"]


@dataclass(frozen=True, slots=True)
class _Sample:
    reward: float
    correct: bool
    tokens: int | None  # None: the length is not known here (a harness's session)


class Scores:
    """The k scores of every prompt of ``sets``, filled in as samples finish."""

    def __init__(self, sets: Sequence[ValidationSet], samples: int, threshold: float) -> None:
        if samples < 1:
            raise ValueError(f"samples={samples}: expected an integer >= 1")
        self.sets = list(sets)
        self.samples = samples
        self.threshold = threshold
        self.errors = 0
        self._got: list[list[list[_Sample]]] = [[[] for _ in s.samples] for s in self.sets]
        self._left = samples * sum(len(s.samples) for s in self.sets)

    @property
    def left(self) -> int:
        """Samples not scored yet."""
        return self._left

    def record(self, which: int, prompt: int, reward: float, tokens: int | None) -> None:
        """One sample of prompt ``prompt`` of set ``which``."""
        got = self._got[which][prompt]
        if len(got) >= self.samples:
            raise ValueError(f"set {which} prompt {prompt}: more than {self.samples} samples")
        got.append(_Sample(reward, reward >= self.threshold, tokens))
        self._left -= 1

    def failed(self, which: int, prompt: int, tokens: int | None = 0) -> None:
        """A sample that could not be scored: reward 0, counted as an error."""
        self.errors += 1
        got = self._got[which][prompt]
        got.append(_Sample(0.0, False, tokens))
        self._left -= 1

    def metrics(self) -> dict[str, Any]:
        """The ``val_*`` figures of the finished pass."""
        if self._left:
            raise ValueError(f"{self._left} samples of the pass are not scored yet")
        ks = pass_ks(self.samples)
        every = [prompt for per_set in self._got for prompt in per_set]
        out: dict[str, Any] = {f"val_{key}": value for key, value in _figures(every, ks).items()}
        out.update(
            val_samples=self.samples,
            val_reward_errors=self.errors,
            val_pass_ks=ks,
            val_sources=[s.name for s in self.sets],
            val_by_source={
                s.name: _figures(per_set, ks)
                for s, per_set in zip(self.sets, self._got, strict=True)
            },
        )
        return out


def _figures(prompts: Sequence[Sequence[_Sample]], ks: Sequence[int]) -> dict[str, Any]:
    if not prompts:
        return {"prompts": 0}
    rewards = [s.reward for prompt in prompts for s in prompt]
    figures: dict[str, Any] = {
        "reward": math.fsum(rewards) / len(rewards),
        "best_reward": math.fsum(max(s.reward for s in p) for p in prompts) / len(prompts),
    }
    correct = [[s.correct for s in prompt] for prompt in prompts]
    for k in ks:
        figures[f"pass@{k}"] = mean_pass_at_k(correct, k)
    tokens = [s.tokens for prompt in prompts for s in prompt]
    if None not in tokens:  # a length unknown for some: none is said
        figures["response_tokens"] = math.fsum(tokens) / len(tokens)  # type: ignore[arg-type]
    figures["prompts"] = len(prompts)
    return figures


def table_text(metrics: dict[str, Any]) -> str:
    """``metrics`` (a pass's ``val_*``) as a text table, a row per data source and one for
    all of them."""
    ks = metrics.get("val_pass_ks") or [1]
    samples = metrics.get("val_samples", 1)
    head = ["source", "prompts", f"mean@{samples}", *(f"pass@{k}" for k in ks), "best", "tokens"]
    rows = []
    by_source = metrics.get("val_by_source") or {}
    names = list(metrics.get("val_sources") or by_source)
    overall = {
        key[len("val_") :]: value for key, value in metrics.items() if key.startswith("val_")
    }
    for name, figures in [*((n, by_source[n]) for n in names), ("all", overall)]:
        if name == "all" and len(names) == 1:
            continue  # the one source's row already says it
        rows.append(
            [
                name,
                str(figures.get("prompts", "")),
                _fixed(figures.get("reward")),
                *(_fixed(figures.get(f"pass@{k}")) for k in ks),
                _fixed(figures.get("best_reward")),
                _fixed(figures.get("response_tokens"), 1),
            ]
        )
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [head, *rows]
    ]
    return "\n".join(lines)


def _fixed(value: Any, digits: int = 3) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) else "-"
