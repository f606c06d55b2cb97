"""The RL roles with ``backends.generate=sglang``, on a stand-in for SGLang's engine.

``sglang.Engine`` needs a CUDA device, so the generate role's engine here is a stand-in
with SGLang's boundary (``GenerationEngine`` in ``engines/sglang/runner.py``) that samples
from the tiny model with our own model code, on CPU, and takes new versions from the
flattened buckets the decoder sends (rebuilt and loaded into its model). What runs for
real is everything around the engine: the role's wiring, the weight plane, buckets,
pause/update/continue, per-token versions, validation through the same engine, and the
trainer consuming the rollouts.
Tokens tagged with the wrong version would show as a log-prob mismatch against logp,
which scores every group again for this engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.actors.engines.sglang.buckets import Bucket, rebuild
from asyncrl.actors.engines.sglang.runner import EngineRunner
from asyncrl.actors.policy.checkpoint import load_model, load_state, model_dir
from asyncrl.actors.roles import generate
from asyncrl.runtime.contract.config import RunConfig
from tests.integration.test_rl_pipeline import STEPS, lines, rl_config, run

pytestmark = pytest.mark.timeout(120)


class TorchBackedEngine:
    """Samples like SGLang would, from our own model on CPU (SGLang itself needs a GPU)."""

    def __init__(self, path: str, seed: int) -> None:
        self.model, _ = load_model(path)
        self.model.eval()
        self.tied = self.model.config.tie_word_embeddings
        self.generator = torch.Generator().manual_seed(seed)
        self.running = asyncio.Event()
        self.running.set()
        self.aborted: set[str] = set()
        self.pending: dict[str, torch.Tensor] = {}
        self.versions: list[int] = []

    async def generate(
        self, rid: str, input_ids: list[int], sampling_params: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        ids = list(input_ids)
        stops = set(sampling_params["stop_token_ids"])
        temperature = sampling_params["temperature"]
        reported: list[tuple[float, int, None]] = []
        while True:
            await asyncio.sleep(0)  # other requests, aborts and pauses get their turn
            await self.running.wait()
            if rid in self.aborted:
                finish = {"type": "abort"}
                yield {"meta_info": {"output_token_logprobs": reported, "finish_reason": finish}}
                return
            with torch.inference_mode():
                logits = self.model(torch.tensor([ids]))[0, -1].float()
            if temperature == 0:
                logprobs = torch.log_softmax(logits, -1)
                token = int(logprobs.argmax())
            else:
                logprobs = torch.log_softmax(logits / temperature, -1)
                token = int(torch.multinomial(logprobs.exp(), 1, generator=self.generator))
            ids.append(token)
            reported = [*reported, (float(logprobs[token]), token, None)]
            finish = None
            if token in stops:
                finish = {"type": "stop", "matched": token}
            elif len(reported) >= sampling_params["max_new_tokens"]:
                finish = {"type": "length", "length": len(reported)}
            yield {"meta_info": {"output_token_logprobs": reported, "finish_reason": finish}}
            if finish is not None:
                return

    def abort(self, rid: str) -> None:
        self.aborted.add(rid)

    async def pause(self) -> None:
        self.running.clear()

    async def update(self, bucket: Bucket, version: int, *, last: bool) -> None:
        self.pending |= {n: t.clone() for n, t in rebuild([bucket], tied_embeddings=False).items()}
        if last:  # the whole version is in: the model runs on it from the continue
            load_state(self.model, self.pending)
            self.pending = {}
            self.versions.append(version)

    async def resume(self) -> None:
        self.running.set()

    def shutdown(self) -> None:
        pass


def test_the_rl_roles_run_with_backends_generate_sglang(tmp_path: Path, monkeypatch) -> None:
    engines: list[TorchBackedEngine] = []

    def start_stand_in(cfg: RunConfig, index: int | None):
        directory = model_dir(cfg.model.path)
        engine = TorchBackedEngine(str(directory), seed=cfg.run.seed + (index or 0))
        engines.append(engine)
        runner = EngineRunner(engine, bucket_mb=1, tied_embeddings=engine.tied, settle_s=0.001)
        _, codec = load_model(str(directory))
        return runner, codec, engine.model.config

    monkeypatch.setattr(generate, "start_sglang", start_stand_in)
    cfg = rl_config(tmp_path)
    cfg = dataclasses.replace(cfg, backends=dataclasses.replace(cfg.backends, generate="sglang"))
    status = run(cfg)
    assert status["run"]["finished"] and status["dead"] == {}
    run_dir = Path(cfg.run.dir)
    steps = lines(run_dir / "metrics.jsonl")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # The engine ran the versions the trainer published, loaded from flattened buckets.
    (engine,) = engines
    assert engine.versions and engine.versions == sorted(engine.versions)
    loads = [x["version"] for x in lines(run_dir / "weights.jsonl") if x["worker"] == "generate-0"]
    # (the report of a load in the run's last moments may not be written before it ends)
    assert loads and loads == engine.versions[: len(loads)]
    # Every token's version names the weights that sampled it: logp, scoring again under
    # the same version, gets the same log-probs.
    measured = [s["logprob_mismatch_mean"] for s in steps if s["logprob_mismatch_tokens"]]
    assert measured and max(measured) < 1e-4
    validated = [v["version"] for v in lines(run_dir / "validation.jsonl")]
    assert validated and validated[0] == 0
    assert json.loads((run_dir / "final" / "config.json").read_text())
