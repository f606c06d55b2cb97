"""The decoder surface over vLLM: token ids in, tokens with log-probs and versions out.

:class:`VLLMDecoder` has the public surface of the PyTorch
:class:`~asyncrl.actors.policy.decoder.Decoder` (``submit``, ``step``, ``cancel``,
``busy``, ``free_slots``, ``load``, ``version``), so episodes, validation and the served
API drive either the same way. vLLM does the batching, the paged KV cache, prefix caching
and the sampling (:class:`~.engine.VLLMEngine` steps it); this module feeds it token ids
and keeps the books: each token with the version current at the engine step that
sampled it, and its log-prob, vLLM's ``processed_logprobs``: of the distribution sampled
from, after the temperature, min-p, top-k and top-p, as the PyTorch decoder records them
and the scorers compute them (:mod:`~asyncrl.actors.policy.sampling`).

Stop texts are not vLLM's ``stop``: that needs vLLM to detokenize every response, and its
detokenizer's text may differ from our codec's. They are found on our codec's text
(:class:`~asyncrl.actors.policy.decoder.StopTexts`), as every engine's decoder finds them,
and the response ends with the token that completes one, as with the PyTorch decoder.

``vllm`` is imported when a decoder first submits, so that this module loads without it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
import torch

from ...policy.decoder import (
    Finished,
    Request,
    StopTexts,
    check_request,
    end_ids,
    ends_by_rule,
)
from ...policy.sampling import Sampling
from .engine import VLLMEngine

__all__ = ["VLLMDecoder"]

log = structlog.get_logger("asyncrl.vllm")


@dataclass
class _Response:
    request: Request
    request_id: str
    budget: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


class VLLMDecoder:
    """Generates through a :class:`VLLMEngine`, for up to ``slots`` requests at a time."""

    def __init__(
        self,
        engine: VLLMEngine,
        *,
        slots: int,
        max_new_tokens: int,
        max_prompt_tokens: int,
        eos_id: int | Collection[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        stop: tuple[str, ...] = (),
        decode: Callable[[list[int]], str] | None = None,
        seed: int | None = None,
    ) -> None:
        """``stop``: texts that end every response, found with ``decode`` (token ids to
        text; see :class:`StopTexts`)."""
        # The defaults of requests that name none (ValueError naming a bad one).
        self.sampling = Sampling(temperature, top_p, top_k, min_p)
        self.stop_texts = StopTexts.of(stop, decode)
        self.engine = engine
        self.slots = slots
        self.max_new_tokens = max_new_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.eos_ids = end_ids(eos_id)
        # A seed makes each request's draws reproducible (vLLM seeds it alone: its tokens
        # do not depend on what else is in the batch).
        self.seed = seed
        self._number = engine.register()
        self._requests = itertools.count()
        self._live: dict[Any, _Response] = {}  # tag → response so far
        self._tags: dict[str, Any] = {}  # request id → tag
        # Prompt tokens submitted, and those vLLM found in its prefix cache (whole pages of
        # block_size tokens: a group's samples share their prompt's).
        self.prompt_tokens = 0
        self.cached_prompt_tokens = 0

    # --- the caller's side ------------------------------------------------------------

    @property
    def version(self) -> int:
        return self.engine.version

    def submit(self, requests: Iterable[Request]) -> None:
        for request in requests:
            check_request(request, self.max_prompt_tokens)
            if request.tag in self._live:
                raise ValueError(f"request {request.tag!r} is already running")
            count = next(self._requests)
            request_id = f"{self._number}:{count}"
            budget = min(self.max_new_tokens, request.max_new_tokens or self.max_new_tokens)
            response = _Response(request, request_id, budget)
            self.engine.add(request_id, list(request.prompt), self._params(request, count, budget))
            self._live[request.tag] = response
            self._tags[request_id] = request.tag
            self.prompt_tokens += len(request.prompt)

    def step(self) -> list[Finished]:
        """Advance the engine one step; the responses that ended."""
        if not self._live:
            return []
        self.engine.step()
        finished = []
        for output, version in self.engine.take(self._number):
            tag = self._tags.get(output.request_id)
            if tag is None:
                continue  # cancelled since
            response = self._live[tag]
            done = self._take(response, output, version)
            if done is not None:
                finished.append(done)
        return finished

    def cancel(self, tags: Collection[Any]) -> None:
        """Drop the requests tagged ``tags`` (their group failed): aborted in the engine."""
        ids = [self._forget(tag) for tag in tags if tag in self._live]
        self.engine.abort(ids)

    def close(self) -> None:
        """Abort every request of this decoder (a new one replaces it)."""
        self.cancel(list(self._live))
        self.engine.unregister(self._number)

    @property
    def busy(self) -> bool:
        return bool(self._live)

    @property
    def free_slots(self) -> int:
        """Slots that no request, running or waiting, will take."""
        return self.slots - len(self._live)

    def load(
        self, state: Mapping[str, torch.Tensor], version: int, *, copy: bool = True
    ) -> list[torch.Tensor]:
        """Take new weights now; requests in flight go on under them from the next token.
        vLLM copies them into its own (packed) weights, so ``state`` is free again when
        this returns (``copy`` makes no difference) and no tensor of ours is superseded."""
        del copy
        self.engine.load(state, version)
        return []

    # --- inside a step ------------------------------------------------------------------

    def _take(self, response: _Response, output: Any, version: int) -> Finished | None:
        """The tokens of one output (only the new ones: outputs are deltas), each with the
        ``version`` that sampled it; the response if it ended."""
        completion = output.outputs[0]
        request = response.request
        if not response.tokens:  # its first output: the prefill's
            self.cached_prompt_tokens += output.num_cached_tokens or 0
        for index, token in enumerate(completion.token_ids):
            response.tokens.append(token)
            response.logprobs.append(_logprob_of(completion.logprobs, index, token))
            response.versions.append(version)
            stopped = token in self.eos_ids or token in request.stop_ids
            if stopped or ends_by_rule(request, self.stop_texts, response.tokens):
                if not output.finished:
                    # Ended by a rule of ours (stop texts) that the engine does not know.
                    self.engine.abort([response.request_id])
                return self._finish(response, stopped_by=token)
            if len(response.tokens) >= response.budget:
                if not output.finished:
                    self.engine.abort([response.request_id])
                return self._finish(response, stopped_by=None)
        if output.finished:
            # Ended without a stop of ours or the budget: vLLM's own limit (the model's
            # context length) or an abort from elsewhere. What was generated is kept.
            log.warning(
                "vllm ended a response early",
                tag=str(request.tag),
                reason=completion.finish_reason,
                tokens=len(response.tokens),
            )
            return self._finish(response, stopped_by=None)
        return None

    def _finish(self, response: _Response, *, stopped_by: int | None) -> Finished:
        self._forget(response.request.tag)
        return Finished(
            tag=response.request.tag,
            prompt=response.request.prompt,
            tokens=response.tokens,
            logprobs=response.logprobs,
            versions=response.versions,
            truncated=stopped_by is None,
            stopped_by=stopped_by,
        )

    def _forget(self, tag: Any) -> str:
        response = self._live.pop(tag)
        self._tags.pop(response.request_id, None)
        return response.request_id

    def _params(self, request: Request, count: int, budget: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=budget,
            # The PyTorch decoder's end ids; the stop token stays in the response (it is
            # trained, with its log-prob). The model's own end ids are among ours.
            stop_token_ids=sorted(self.eos_ids | request.stop_ids),
            ignore_eos=True,
            **self._sampling_of(request, count),
            logprobs=0,  # the sampled token's own
            detokenize=False,  # token ids in and out: the codec is ours
            output_kind=RequestOutputKind.DELTA,
        )

    def _sampling_of(self, request: Request, count: int) -> dict[str, Any]:
        """The request's sampling (the decoder's where it names none) in vLLM's terms:
        the temperature, then min-p, then top-k, then top-p, as ours (``sampling.py``), so
        that the log-probs are of the distribution the scorers compute."""
        own = self.sampling
        if request.seed is not None:
            seed = request.seed  # vLLM draws a seeded request's tokens on their own
        elif self.seed is not None:
            seed = (self.seed * 1_000_003 + count) % (1 << 63)
        else:
            seed = None
        if request.greedy:  # the log-prob is then of the untempered softmax
            return {"temperature": 0.0, "seed": seed}
        return {
            "temperature": own.temperature if request.temperature is None else request.temperature,
            "top_p": own.top_p if request.top_p is None else request.top_p,
            "top_k": own.top_k if request.top_k is None else request.top_k,  # 0: every token
            "min_p": own.min_p if request.min_p is None else request.min_p,  # 0: off
            "seed": seed,
        }


def _logprob_of(logprobs: Any, index: int, token: int) -> float:
    if logprobs is None:
        raise RuntimeError("vLLM returned no log-probs (requested with logprobs=0)")
    return float(logprobs[index][token].logprob)
