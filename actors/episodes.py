"""Episodes: trajectories of model turns and environment steps, sharing one decoder.

Without an environment an episode is one turn: the prompt, then the response. With one
(:mod:`.tasks.environment`), ``reset`` gives the prompt; each model turn ends at
end-of-sequence or a stop token, its text goes to ``step`` and the observation that comes
back is appended to the trajectory, untrained, before the next turn. Every token the
model samples keeps its behaviour log-prob and the policy version it was drawn under, so
a trajectory whose turns straddle a weight update says so token by token.

Environment calls run on threads of their own while the decoder goes on with every other
sequence: a tool that takes a second stalls its own episode only. A call that raises,
returns garbage or outlives ``step_timeout_s`` fails its episode with the reason; a call
past its time keeps its thread (Python cannot stop one), and ``stuck`` counts them so the
generator can leave for a fresh process before they pile up.

A continued turn is submitted as a new request whose prompt is the whole trajectory so
far. A turn that may have another after it asks the decoder to keep its cache
(``Request.keep_cache``), so the next turn computes only the observation and what follows:
our decoder then reuses the kept keys and values, as an engine with a prefix cache does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .policy.decoder import Decoding, Finished, Request
from .policy.tokenizer import TextCodec
from .tasks import Sample
from .tasks.environment import (
    Environment,
    EnvironmentFailed,
    check_reset,
    check_step,
)

__all__ = ["EpisodeDone", "EpisodeLimits", "Episodes"]


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int  # model turns per episode
    max_total_tokens: int  # prompt, turns and observations together
    step_timeout_s: float  # one reset or step call; 0: no limit


@dataclass(frozen=True)
class EpisodeDone:
    """A finished trajectory: every token, whose it was, and what the environment paid."""

    tag: Hashable
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    trained: list[bool]  # True on the model's own tokens
    truncated: bool  # a length or turn limit ended it, not the model or the environment
    reward: float | None  # the environment's sum; None without one
    last_turn: list[int]  # the model's final turn (what a reward function scores)
    turns: int
    # The experts of the tokens the model read, as its last turn recorded them
    # (Finished.routes); None: its decoder does not record.
    routes: np.ndarray | None = None


@dataclass
class _Call:
    """One environment call on a daemon thread (never holds up the process's exit)."""

    started: float
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None
    thread: threading.Thread | None = None

    @classmethod
    def start(cls, function: Callable[..., Any], *args: Any, now: float) -> _Call:
        call = cls(now)

        def run() -> None:
            try:
                call.value = function(*args)
            except BaseException as error:  # handed to the episode, which fails with it
                call.error = error
            call.done.set()

        call.thread = threading.Thread(target=run, name="environment call", daemon=True)
        call.thread.start()
        return call


@dataclass
class _Episode:
    tag: Hashable
    sample: Sample
    greedy: bool
    environment: Environment | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    last_turn: list[int] = field(default_factory=list)
    turns: int = 0
    reward: float = 0.0
    routes: np.ndarray | None = None  # the last turn's (Finished.routes)
    call: _Call | None = None
    kind: str = ""  # the call in flight: "reset" or "step"

    def add(self, tokens: list[int], logprobs=None, versions=None, *, trained: bool) -> None:
        self.tokens += tokens
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)
        self.versions += versions if versions is not None else [0] * len(tokens)
        self.trained += [trained] * len(tokens)


class Episodes:
    """Every running episode of one decoder. Call :meth:`step` as the decode loop."""

    def __init__(
        self,
        decoder: Decoding,
        codec: TextCodec,
        *,
        environment: Callable[[], Environment] | None = None,
        name: str = "",
        limits: EpisodeLimits | None = None,
        stop_ids: Collection[int] = (),
        clock: Callable[[], float] = time.monotonic,
        others: Callable[[Finished], None] | None = None,
    ) -> None:
        self.decoder = decoder
        self.codec = codec
        self.environment = environment
        self.name = name
        context = decoder.max_prompt_tokens + decoder.max_new_tokens
        self.limits = limits or EpisodeLimits(1, context, 0.0)
        self.stop_ids = frozenset(stop_ids)
        self.clock = clock
        self.others = others  # sequences of the decoder that are not episodes' (API calls)
        self.running: dict[Hashable, _Episode] = {}
        self._left_behind: list[_Call] = []
        self._failed_early: list[tuple[Hashable, str]] = []

    # --- the caller's side ------------------------------------------------------------

    def begin(self, tag: Hashable, sample: Sample, prompt: tuple[int, ...], greedy=False) -> None:
        """Start an episode on ``sample`` (``prompt``: its tokens, used without an
        environment; with one, ``reset`` says what the prompt is)."""
        if self.environment is None:
            # Submitted first: a prompt the decoder cannot take raises, leaving nothing.
            self.decoder.submit([Request(tag, prompt, greedy=greedy)])
            self.running[tag] = episode = _Episode(tag, sample, greedy, None)
            episode.add(list(prompt), trained=False)
        else:
            try:
                environment = self.environment()
            except Exception as error:  # a factory that worked at start fails now
                reason = f"making one raised {type(error).__name__}: {error}"
                self._failed_early.append((tag, f"environment {self.name!r}: {reason}"))
                return
            self.running[tag] = episode = _Episode(tag, sample, greedy, environment)
            episode.kind = "reset"
            episode.call = _Call.start(environment.reset, sample, now=self.clock())

    def step(self) -> tuple[list[EpisodeDone], list[tuple[Hashable, str]]]:
        """Advance: take environment answers, decode one token everywhere. Returns the
        episodes that ended, and those that failed with the reason (both leave)."""
        done: list[EpisodeDone] = []
        failed, self._failed_early = self._failed_early, []
        for episode in [e for e in self.running.values() if e.call is not None]:
            try:
                finished = self._answered(episode)
            except EnvironmentFailed as error:
                failed.append((episode.tag, str(error)))
                del self.running[episode.tag]
                continue
            if finished is not None:
                done.append(finished)
        for turn in self.decoder.step():
            episode = self.running.get(turn.tag)
            if episode is None:
                # Someone else's sequence, or an episode cancelled during its last token.
                if self.others is not None:
                    self.others(turn)
                continue
            finished = self._turn_ended(episode, turn)
            if finished is not None:
                done.append(finished)
        return done, failed

    def cancel(self, tags: Collection[Hashable]) -> None:
        """Drop these episodes (their group failed): decoding stops, calls are ignored."""
        self.decoder.cancel(tags)
        for tag in tags:
            self.running.pop(tag, None)

    @property
    def busy(self) -> bool:
        return bool(self.running or self._failed_early)

    @property
    def stuck(self) -> int:
        """Environment calls that ran past their time and are still running."""
        self._left_behind = [c for c in self._left_behind if c.thread and c.thread.is_alive()]
        return len(self._left_behind)

    # --- inside ---------------------------------------------------------------------

    def _answered(self, episode: _Episode) -> EpisodeDone | None:
        call = episode.call
        assert call is not None
        if not call.done.is_set():
            timeout = self.limits.step_timeout_s
            if timeout and self.clock() - call.started > timeout:
                self._left_behind.append(call)
                episode.call = None
                raise EnvironmentFailed(
                    f"environment {self.name!r}: {episode.kind} did not return within "
                    f"{timeout:g} s (data.env_step_timeout_s)"
                )
            return None
        episode.call = None
        if call.error is not None:
            error = call.error
            raise EnvironmentFailed(
                f"environment {self.name!r}: {episode.kind} raised {type(error).__name__}: {error}"
            )
        if episode.kind == "reset":
            prompt = self.codec.encode(check_reset(call.value, self.name))
            if not 0 < len(prompt) <= self.decoder.max_prompt_tokens:
                raise EnvironmentFailed(
                    f"environment {self.name!r}: reset's prompt is {len(prompt)} tokens; the "
                    f"generator takes 1..{self.decoder.max_prompt_tokens}"
                )
            episode.add(prompt, trained=False)
            return self._turn(episode)
        result = check_step(call.value, self.name)
        episode.reward += result.reward
        if result.done:
            return self._finish(episode, truncated=False)
        if episode.turns >= self.limits.max_turns:
            return self._finish(episode, truncated=True)  # the environment wanted more
        observation = self.codec.encode(result.observation)
        if len(episode.tokens) + len(observation) >= self.limits.max_total_tokens:
            return self._finish(episode, truncated=True)
        episode.add(observation, trained=False)
        return self._turn(episode)

    def _turn(self, episode: _Episode) -> EpisodeDone | None:
        """Submit the model's next turn, or end the episode if no token fits."""
        room = self.limits.max_total_tokens - len(episode.tokens)
        if room < 1 or len(episode.tokens) > self.decoder.max_prompt_tokens:
            return self._finish(episode, truncated=True)
        request = Request(
            episode.tag,
            tuple(episode.tokens),
            greedy=episode.greedy,
            max_new_tokens=min(room, self.decoder.max_new_tokens),
            stop_ids=self.stop_ids,
            keep_cache=episode.environment is not None
            and episode.turns + 1 < self.limits.max_turns,
        )
        self.decoder.submit([request])
        return None

    def _turn_ended(self, episode: _Episode, turn: Finished) -> EpisodeDone | None:
        episode.add(turn.tokens, turn.logprobs, turn.versions, trained=True)
        episode.last_turn = list(turn.tokens)
        # A turn's prompt is the whole episode so far: its record covers every turn before.
        episode.routes = turn.routes
        episode.turns += 1
        if episode.environment is None:
            return self._finish(episode, truncated=turn.truncated)
        if turn.truncated and len(episode.tokens) >= self.limits.max_total_tokens:
            return self._finish(episode, truncated=True)
        action = self.codec.decode(turn.tokens)
        episode.kind = "step"
        episode.call = _Call.start(episode.environment.step, action, now=self.clock())
        return None

    def _finish(self, episode: _Episode, *, truncated: bool) -> EpisodeDone:
        del self.running[episode.tag]
        return EpisodeDone(
            tag=episode.tag,
            tokens=episode.tokens,
            logprobs=episode.logprobs,
            versions=episode.versions,
            trained=episode.trained,
            truncated=truncated,
            reward=episode.reward if episode.environment is not None else None,
            last_turn=episode.last_turn,
            turns=episode.turns,
            routes=episode.routes,
        )
