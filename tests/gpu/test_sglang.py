"""SGLang as the generation engine, for real: a version loaded mid-request, and a short RL run.

Marked ``gpu``: skipped where torch sees no CUDA device, and where SGLang is not installed
(``pip install 'asyncrl[gpu]'``); the CPU tests drive the same decoder against a fake
engine (``tests/unit/actors/engines/test_sglang_decoder.py``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import EMBEDDED_DIR, load_model, state_for_saving
from asyncrl.actors.policy.decoder import Finished, Request

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(
        importlib.util.find_spec("sglang") is None,
        reason="SGLang is not installed (pip install 'asyncrl[gpu]')",
    ),
    pytest.mark.timeout(600),
]


def test_sglang_generates_with_logprobs_and_takes_a_new_version_mid_request() -> None:
    from asyncrl.actors.engines.sglang.engine import SGLangDecoder, start_engine

    model, codec = load_model("embedded", torch.bfloat16)
    runner = start_engine(
        str(EMBEDDED_DIR),
        device=torch.device("cuda", 0),
        dtype="bfloat16",
        context_length=model.config.max_position_embeddings,
        seed=0,
        version=0,
        bucket_mb=1,  # several buckets, even for this model
        tied_embeddings=model.config.tie_word_embeddings,
        mem_fraction=0.3,
    )
    try:
        decoder = SGLangDecoder(
            runner, slots=8, max_new_tokens=64, max_prompt_tokens=32, eos_id=codec.eos_ids
        )
        prompt = tuple(codec.encode("12+34="))
        decoder.submit([Request(j, prompt) for j in range(4)])
        results: list[Finished] = []
        deadline = time.monotonic() + 120
        loaded = False
        while len(results) < 4:
            results += decoder.step()
            if not loaded:  # a new version while the requests run
                state = {n: t.float().cpu() + 0.01 for n, t in state_for_saving(model).items()}
                state = {n: t.to(torch.bfloat16) for n, t in state.items()}
                assert decoder.load(state, 1) == []
                loaded = True
            assert time.monotonic() < deadline
        for finished in results:
            assert len(finished.tokens) == len(finished.logprobs) == len(finished.versions)
            assert all(lp <= 0 for lp in finished.logprobs)
            assert finished.versions == sorted(finished.versions)
            assert set(finished.versions) <= {0, 1}
        assert decoder.version == 1
    finally:
        runner.close()


def test_a_short_rl_run_generates_with_sglang(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run"]
    argv += ["-c", "deploy/configs/default.yaml", f"run.dir={run_dir}", "run.total_steps=4"]
    argv += ["backends.generate=sglang", "backends.device=cuda", "model.dtype=bfloat16"]
    argv += ["data.val_every_versions=2", "scheduler.control_port=0", "scheduler.events_port=0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(s["grad_norm"] > 0 for s in steps)
    # Versions the trainer published reached the SGLang generator, bucket by bucket.
    moved = [json.loads(line) for line in (run_dir / "weights.jsonl").open()]
    assert {m["version"] for m in moved if m["worker"].startswith("generate")} >= {1}
