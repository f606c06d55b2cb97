"""One validation pass: k episodes on each prompt of every validation set, decoded by the
caller's episodes (its engine and version), scored by the run's reward as they finish.

The generate role runs one beside training, a step at a time on its decode loop;
``asyncrl eval`` runs one on a checkpoint until it is done. Both begin the episodes in the
same order (set by set, prompt by prompt, the k samples of a prompt together), so that
with the same weights, engine and seed they decode the same batches and, greedily, the
same responses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from ..episodes import EpisodeDone, Episodes
from ..tasks import Sample, TaskError
from .scores import Scores
from .sets import ValidationSet

__all__ = ["ScoredSample", "ValidationPass"]

log = structlog.get_logger("asyncrl.validation")


@dataclass(frozen=True, slots=True)
class ScoredSample:
    """One sample of a pass, as ``asyncrl eval`` writes it (``samples.jsonl``)."""

    source: str
    prompt_index: int
    sample_index: int
    prompt: str
    answer: str
    response: str
    reward: float | None  # None: it could not be scored
    response_tokens: int
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "prompt_index": self.prompt_index,
            "sample": self.sample_index,
            "prompt": self.prompt,
            "answer": self.answer,
            "response": self.response,
            "reward": self.reward,
            "response_tokens": self.response_tokens,
            **({"error": self.error} if self.error else {}),
        }


class ValidationPass:
    """The pass of ``version``: begun at construction, advanced by :meth:`step`."""

    def __init__(
        self,
        version: int,
        episodes: Episodes,
        sets: list[ValidationSet],
        *,
        samples: int,
        greedy: bool,
        reward: Callable[[Sample, str], float],
        encode: Callable[[str], list[int]],
        decode: Callable[[list[int]], str],
        threshold: float,
        keep: bool = False,
    ) -> None:
        self.version = version
        self.episodes = episodes
        self.sets = sets
        self.reward = reward
        self.decode = decode
        self.scores = Scores(sets, samples, threshold)
        self.kept: list[ScoredSample] | None = [] if keep else None
        self.started = time.monotonic()
        for which, validation_set in enumerate(sets):
            for index, sample in enumerate(validation_set.samples):
                prompt = tuple(encode(sample.prompt))
                for j in range(samples):
                    episodes.begin((which, index, j), sample, prompt, greedy=greedy)

    @property
    def done(self) -> bool:
        return self.scores.left == 0

    @property
    def left(self) -> int:
        return self.scores.left

    def step(self) -> list[ScoredSample]:
        """Decode a step; score what finished. Returns the samples scored now (kept or
        not: a progress bar counts them)."""
        finished, failed = self.episodes.step()
        scored = []
        for tag, reason in failed:
            log.warning("validation episode failed", version=self.version, reason=reason)
            which, index, j = tag
            self.scores.failed(which, index)
            scored.append(self._scored(which, index, j, "", None, 0, reason))
        for episode in finished:
            scored.append(self._score(episode))
        if self.kept is not None:
            self.kept += scored
        return scored

    def close(self) -> None:
        """Stop decoding the pass (its requests leave the engine)."""
        self.episodes.decoder.close()

    def metrics(self) -> dict[str, Any]:
        """The pass's figures (:mod:`.scores`) and the seconds it took."""
        return {**self.scores.metrics(), "val_seconds": round(time.monotonic() - self.started, 3)}

    def _score(self, episode: EpisodeDone) -> ScoredSample:
        which, index, j = episode.tag
        sample = self.sets[which].samples[index]
        response = self.decode(episode.last_turn)
        tokens = sum(episode.trained)  # the model's own tokens, every turn
        if episode.reward is not None:  # what the environment paid
            self.scores.record(which, index, episode.reward, tokens)
            return self._scored(which, index, j, response, episode.reward, tokens)
        try:
            reward = self.reward(sample, response)
        except TaskError as error:
            log.warning("validation reward failed", version=self.version, reason=str(error))
            self.scores.failed(which, index, tokens)
            return self._scored(which, index, j, response, None, tokens, str(error))
        self.scores.record(which, index, reward, tokens)
        return self._scored(which, index, j, response, reward, tokens)

    def _scored(
        self,
        which: int,
        index: int,
        j: int,
        response: str,
        reward: float | None,
        tokens: int,
        error: str = "",
    ) -> ScoredSample:
        sample = self.sets[which].samples[index]
        return ScoredSample(
            self.sets[which].name,
            index,
            j,
            sample.prompt,
            sample.answer,
            response,
            reward,
            tokens,
            error,
        )
