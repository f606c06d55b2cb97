"""A stand-in for SGLang's engine at the decoder's boundary (``GenerationEngine``): the
real one needs a CUDA device and SGLang's CUDA kernels. It streams token ids with
log-probs the way SGLang does (cumulative ``output_token_logprobs``, ``finish_reason`` on
the last report), pauses, loads flattened buckets and continues. It generates ``last
input id + 1`` each token, and each token's log-prob is minus the weight value it was
sampled under, so a test can see that every token's version names the weights that
produced it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import torch

from asyncrl.actors.engines.sglang.buckets import Bucket, rebuild
from asyncrl.actors.engines.sglang.engine import SGLangDecoder
from asyncrl.actors.engines.sglang.runner import EngineRunner

__all__ = ["EOS", "FakeSGLangEngine", "decoder_over", "state"]

EOS = 99


class FakeSGLangEngine:
    """Generates ``last input id + 1`` each token, ``token_s`` apart; log-prob: -weights."""

    def __init__(self, *, token_s: float = 0.0005, pause_aborts: bool = False) -> None:
        self.token_s = token_s
        self.pause_aborts = pause_aborts  # SGLang's "abort" pause: in-flight requests end
        self.weights = 0.0
        self.running = asyncio.Event()
        self.running.set()
        self.aborted: set[str] = set()
        self.submitted: list[tuple[str, list[int], dict[str, Any]]] = []
        self.updates: list[tuple[Bucket, int, bool]] = []
        self.produced = 0
        self.calls: list[str] = []
        self.shut = False

    async def generate(
        self, rid: str, input_ids: list[int], sampling_params: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        self.submitted.append((rid, list(input_ids), dict(sampling_params)))
        stops = set(sampling_params["stop_token_ids"])
        reported: list[tuple[float, int, None]] = []
        last = input_ids[-1]
        while True:
            await asyncio.sleep(self.token_s)
            await self.running.wait()
            if rid in self.aborted:
                aborted = {"type": "abort"}
                yield {"meta_info": {"output_token_logprobs": reported, "finish_reason": aborted}}
                return
            last += 1
            self.produced += 1
            reported = [*reported, (-self.weights, last, None)]
            finish = None
            if last in stops:
                finish = {"type": "stop", "matched": last}
            elif len(reported) >= sampling_params["max_new_tokens"]:
                finish = {"type": "length", "length": len(reported)}
            yield {"meta_info": {"output_token_logprobs": reported, "finish_reason": finish}}
            if finish is not None:
                return

    def abort(self, rid: str) -> None:
        self.aborted.add(rid)

    async def pause(self) -> None:
        self.calls.append("pause")
        self.running.clear()
        if self.pause_aborts:
            self.aborted.update(rid for rid, _, _ in self.submitted)
            self.running.set()  # let the streams see their abort; nothing new is sampled
            await asyncio.sleep(0.01)
            self.running.clear()

    async def update(self, bucket: Bucket, version: int, *, last: bool) -> None:
        self.calls.append("update")
        self.updates.append((bucket, version, last))
        weights = rebuild([bucket], tied_embeddings=False)
        if "w" in weights:
            self.weights = float(weights["w"].item())

    async def resume(self) -> None:
        self.calls.append("continue")
        self.running.set()

    def shutdown(self) -> None:
        self.shut = True


def decoder_over(engine: FakeSGLangEngine, **kwargs: Any) -> SGLangDecoder:
    runner = EngineRunner(engine, settle_s=0.005, tied_embeddings=False)
    options = {"slots": 8, "max_new_tokens": 50, "max_prompt_tokens": 16, "eos_id": EOS}
    return SGLangDecoder(runner, **(options | kwargs))


def state(value: float) -> dict[str, torch.Tensor]:
    """A version whose weight ``w`` the fake reads: its tokens' log-probs are ``-value``."""
    return {"w": torch.tensor([value]), "model.norm.weight": torch.ones(4, dtype=torch.bfloat16)}
