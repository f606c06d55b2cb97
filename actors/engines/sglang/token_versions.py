"""Which policy version each generated token was sampled under: plain bookkeeping.

An engine streams each request's tokens as it samples them. A new version is loaded with
the engine paused: no token is sampled between the pause and the continue, so every token
reported before the update was drawn from the old weights and every token after it from
the new ones. The :class:`Ledger` sees reports and updates in that order (the engine's
event loop hands it both) and tags each token with the version current when it arrived.

A request may also be cut off mid-response: aborted by the engine (a pause that drops
requests instead of holding them), or by a restart. It then goes on as a partial rollout:
resubmitted with the prompt and the tokens generated so far as its input and the rest of
its budget, and the tokens of the new submission are appended, each with the version it
was sampled under. What the caller gets is one response, token by token, whatever
happened to it on the way.

Reports come as SGLang streams them: by default each report holds the whole response of
the current submission so far (``cumulative``), else only what is new.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Ledger", "Rollout"]

# One streamed token as SGLang reports it: (logprob, token id, text or None); the text is
# None without a tokenizer in the engine, and ignored here either way.
Reported = Sequence[Any]


@dataclass
class Rollout:
    """One request's response so far, token by token."""

    tag: Hashable
    prompt: tuple[int, ...]
    budget: int  # new tokens allowed in all, over every submission
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    submissions: int = 1
    streamed: int = 0  # tokens of the current submission already taken

    @property
    def input_ids(self) -> list[int]:
        """What a (re)submission sends: the prompt and the response so far."""
        return [*self.prompt, *self.tokens]

    @property
    def remaining(self) -> int:
        return self.budget - len(self.tokens)

    def cut(self, length: int) -> None:
        """Keep the first ``length`` response tokens (a stop seen inside a report)."""
        del self.tokens[length:], self.logprobs[length:], self.versions[length:]


class Ledger:
    """The engine's version as its event loop sees it, and every running rollout."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.rollouts: dict[Hashable, Rollout] = {}

    def begin(self, tag: Hashable, prompt: tuple[int, ...], budget: int) -> Rollout:
        if tag in self.rollouts:
            raise ValueError(f"request {tag!r} is already running")
        if budget < 1:
            raise ValueError(f"budget={budget}: expected >= 1 new token")
        rollout = self.rollouts[tag] = Rollout(tag, prompt, budget)
        return rollout

    def update(self, version: int) -> None:
        """The engine runs on ``version`` from now on (called between pause and continue)."""
        if version < self.version:
            raise ValueError(f"version {version} after {self.version}: versions only go up")
        self.version = version

    def report(
        self, tag: Hashable, reported: Sequence[Reported], *, cumulative: bool = True
    ) -> list[int]:
        """Take a stream report for ``tag``; the tokens it adds, tagged with the version now."""
        rollout = self.rollouts[tag]
        if cumulative and reported:
            _check_continues(rollout, reported)
        new = reported[rollout.streamed :] if cumulative else reported
        for entry in new:
            rollout.tokens.append(int(entry[1]))
            rollout.logprobs.append(float(entry[0]))
            rollout.versions.append(self.version)
        rollout.streamed += len(new)
        return rollout.tokens[len(rollout.tokens) - len(new) :]

    def resubmit(self, tag: Hashable) -> Rollout:
        """``tag`` was cut off: it goes on from prompt + response so far, in a new stream."""
        rollout = self.rollouts[tag]
        if rollout.remaining < 1:
            raise ValueError(f"request {tag!r} has no budget left to continue")
        rollout.submissions += 1
        rollout.streamed = 0
        return rollout

    def finish(self, tag: Hashable) -> Rollout:
        return self.rollouts.pop(tag)

    def drop(self, tag: Hashable) -> None:
        self.rollouts.pop(tag, None)


def _check_continues(rollout: Rollout, reported: Sequence[Reported]) -> None:
    """A cumulative report must extend what was taken: else its new tokens would be
    misplaced, and tagged with versions that are not theirs."""
    if len(reported) < rollout.streamed:
        raise ValueError(
            f"request {rollout.tag!r}: a report of {len(reported)} tokens after "
            f"{rollout.streamed} (the engine's stream went back)"
        )
    if rollout.streamed and int(reported[rollout.streamed - 1][1]) != rollout.tokens[-1]:
        raise ValueError(
            f"request {rollout.tag!r}: token {rollout.streamed} reported as "
            f"{reported[rollout.streamed - 1][1]}, taken as {rollout.tokens[-1]}"
        )
