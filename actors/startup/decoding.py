"""The decoder and episodes a generator runs, built one way for every caller: the
generate role (training's rollouts, its validation) and ``asyncrl eval``.

Which decoder: our own over a model of this process, or vLLM's or SGLang's engine (which
hold the weights; no model here). How it samples: as training does (``algorithm.*``), or
as validation does (``data.val_sampling``; greedy requests when its temperature is 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.runtime.contract.config import RunConfig

from ..engines.sglang.engine import SGLangDecoder
from ..engines.sglang.runner import EngineRunner
from ..engines.vllm.decoder import VLLMDecoder
from ..engines.vllm.engine import VLLMEngine
from ..episodes import EpisodeLimits, Episodes
from ..policy.config import ModelConfig
from ..policy.decoder import Decoder, Decoding, Finished
from ..policy.model import CausalLM
from ..policy.tokenizer import TextCodec
from ..tasks.environment import Environment

__all__ = ["DEFAULT_SLOTS", "Generation"]

DEFAULT_SLOTS = 64  # sequences a generator decodes at once


@dataclass
class Generation:
    """What a generator decodes with: its engine (or none: our decoder over a model given
    per decoder), tokenizer and model config, and its place in the run."""

    cfg: RunConfig
    engine: VLLMEngine | EngineRunner | None
    codec: TextCodec
    model_config: ModelConfig
    slots: int
    index: int | None  # the generator's: it seeds the sampling

    def decoder(
        self, model: CausalLM | None, *, version: int, validation: bool = False
    ) -> Decoding:
        """A decoder over ``model``, or over the engine; sampling as training does, or as
        validation does."""
        cfg = self.cfg
        max_new = cfg.model.max_new_tokens
        # Not the model's whole context: a real model's would make a cache of many GiB.
        max_prompt = min(
            cfg.model.max_prompt_tokens, self.model_config.max_position_embeddings - max_new
        )
        # Training's settings (algorithm.*) or validation's (data.val_sampling), by the same
        # names; a greedy validation's requests take the most likely token whatever they are.
        source = cfg.data.val_sampling if validation else cfg.algorithm
        sampling: dict[str, Any] = {}
        if not (validation and cfg.data.val_sampling.greedy):
            sampling = {
                key: getattr(source, key) for key in ("temperature", "top_p", "top_k", "min_p")
            }
        # Stop texts say where a response ends, not how it samples: training and validation
        # alike, found on the codec's text whichever engine samples.
        sampling |= dict(stop=tuple(cfg.algorithm.stop), decode=self.codec.decode)
        seed = cfg.run.seed + (self.index or 0)
        eos = self.codec.eos_ids
        if isinstance(self.engine, VLLMEngine):
            return VLLMDecoder(
                self.engine,
                slots=self.slots,
                max_new_tokens=max_new,
                max_prompt_tokens=max_prompt,
                eos_id=eos,
                seed=seed,
                **sampling,
            )
        if self.engine is not None:
            return SGLangDecoder(
                self.engine,
                slots=self.slots,
                max_new_tokens=max_new,
                max_prompt_tokens=max_prompt,
                eos_id=eos,
                **sampling,
            )
        assert model is not None  # the PyTorch decoder runs our own model
        return Decoder(
            model,
            slots=self.slots,
            max_new_tokens=max_new,
            max_prompt_tokens=max_prompt,
            eos_id=eos,
            pad_id=self.codec.pad_id,
            **sampling,
            seed=seed,
            version=version,
            cuda_graphs=cfg.backends.cuda_graphs,
            # Validation's rollouts are never trained: they need no routes.
            record_routes=cfg.algorithm.router_replay.enabled and not validation,
        )

    def episodes(
        self,
        decoder: Decoding,
        *,
        environment: Callable[[], Environment] | None,
        stop_ids: frozenset[int],
        others: Callable[[Finished], None] | None = None,
    ) -> Episodes:
        """Episodes on ``decoder``: one turn each, or turns of ``environment``."""
        data = self.cfg.data
        context = decoder.max_prompt_tokens + decoder.max_new_tokens
        limits = EpisodeLimits(
            max_turns=data.max_turns if environment else 1,
            max_total_tokens=min(data.max_total_tokens or context, context),
            step_timeout_s=data.env_step_timeout_s,
        )
        return Episodes(
            decoder,
            self.codec,
            environment=environment,
            name=data.environment,
            limits=limits,
            stop_ids=stop_ids,
            others=others,
        )
