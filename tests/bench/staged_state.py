"""What staging a trainer's state after each step costs, and restoring it.

    python -m tests.bench.staged_state [--model embedded|110m] [--steps 10]

One rank, fp32, AdamW: its parameters, both moments and the RNG are copied into a slot
file in /dev/shm and checksummed (CRC-32C) per step; a restart reads a slot, checks its
checksum, loads it into a fresh learner and checks the result against it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.model import CausalLM, ModelConfig
from asyncrl.actors.training.learner import Learner
from asyncrl.actors.training.resume import restore, stage
from asyncrl.actors.training.staged_state import StagedState
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.contract.rundir import RunDir
from tests.bench.train_memory import llama_shape

_110M = llama_shape(layers=12, hidden=768, vocab=16000)  # train_memory.py measures it


def _learner(name: str, run_dir: Path) -> Learner:
    torch.manual_seed(0)
    model = load_model("embedded")[0] if name == "embedded" else CausalLM(ModelConfig(**_110M))
    cfg = config_from_dict({"run": {"dir": str(run_dir)}})
    learner = Learner(model, cfg, pad_id=0)
    for param in model.parameters():  # AdamW's state exists after a first step
        param.grad = torch.randn_like(param)
    learner.optimizer.step()
    return learner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("embedded", "110m"), default="embedded")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        run = RunDir(Path(run_dir))
        learner = _learner(args.model, run.root)
        store = StagedState(run.staged_state, 0, {"ranks": 1})
        started = time.perf_counter()
        store.reserve(learner.local_state())
        reserving = time.perf_counter() - started
        try:
            times = []
            for step in range(1, args.steps + 1):
                started = time.perf_counter()
                stage(learner, store, step)
                times.append(time.perf_counter() - started)
            state = sum(t.numel() * t.element_size() for t in learner.local_state().values())
            params = sum(p.numel() for p in learner.model.parameters())
            fresh = _learner(args.model, run.root)
            started = time.perf_counter()
            restore(fresh, StagedState(run.staged_state, 0, {"ranks": 1}), run, args.steps)
            restoring = time.perf_counter() - started
        finally:
            store.remove()
    first, rest = times[0], times[1:]
    print(
        f"staged_state: {args.model}, {params / 1e6:.1f}M parameters, {state / 2**20:.0f} MiB "
        f"staged per step; {os.cpu_count()} CPUs\n"
        f"  both slot files sized and their pages populated, at start: {reserving * 1e3:.0f} ms\n"
        f"  stage: first {first * 1e3:.1f} ms, then median "
        f"{statistics.median(rest) * 1e3:.1f} ms, max {max(rest) * 1e3:.1f} ms "
        f"({state / statistics.median(rest) / 1e9:.1f} GB/s)\n"
        f"  restore (verify, load, check): {restoring * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
