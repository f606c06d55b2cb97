"""Training through two pipeline stages: one micro-batch in flight against 1F1B, side by
side in one run.

    python -m tests.bench.pipeline_schedule [--micro-batches 8] [--steps 4] [--layers 8]
        [--hidden 256]

Two processes (gloo, one torch thread each, as a trainer group's ranks on CPU) hold the
two stages of a random Qwen3-shaped model under the megatron engine. The learner trains
the same lease (one group of 4 responses of 128 tokens after a 64-token prompt per
micro-batch) in both schedules, taking turns step by step after a warm-up step of each:
one micro-batch at a time through both stages (the schedule before 1F1B), and 1F1B, where
the stages work on different micro-batches at once. Prints seconds per step, the ratio,
and what the schedule's arithmetic allows: with M micro-batches of equal cost on P
stages, 1F1B takes (M + P - 1) / M of a stage's own work against P for one at a time.
Needs megatron-core (``pip install -e '.[megatron]'``) and 2 free cores.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from asyncrl.actors.training.gang import Gang
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.runtime.contract.config import MegatronSection, config_from_dict
from asyncrl.runtime.contract.gangs import GangPlace
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p
from tests.support.hf_families import tiny_task_model
from tests.support.ranks import GROUP_SECRET, free_port, start_ranks

PROMPT, RESPONSE, RESPONSES = 64, 128, 4


def lease(groups: int) -> p.Lease:
    rng = np.random.default_rng(0)
    items = []
    for gid in range(groups):
        logprobs = -rng.random((RESPONSES, RESPONSE), dtype=np.float32)
        generated = {
            "prompt_ids": rng.integers(3, 17, size=PROMPT).astype(np.int32),
            "response_ids": rng.integers(3, 17, size=(RESPONSES, RESPONSE)).astype(np.int32),
            "lengths": np.full(RESPONSES, RESPONSE, np.int32),
            "logprobs": logprobs,
            "versions": np.zeros((RESPONSES, RESPONSE), np.int32),
            "truncated": np.zeros(RESPONSES, np.uint8),
        }
        data = {
            Role.GENERATE.value: generated,
            Role.LOGP.value: {"logprobs": logprobs - 0.01, "version": 0},
            Role.REWARD.value: {"rewards": rng.integers(0, 2, RESPONSES).astype(np.float32)},
        }
        items.append(p.Item(gid, f"g{gid}", data))
    return p.Lease(1, 1, Role.TRAIN.value, 60.0, 0, tuple(items))


def rank_main(rank: int, port: int, directory: str, args, results) -> None:
    from asyncrl.actors.engines.megatron.model import load_megatron

    torch.set_num_threads(1)
    gang = Gang(GangPlace(rank, 2, "127.0.0.1", port), secret=GROUP_SECRET, timeout_s=120)
    try:
        section = MegatronSection(pipeline_parallel=2)
        model, codec = load_megatron(directory, torch.float32, torch.device("cpu"), section)
        cfg = config_from_dict({"algorithm": {"micro_batch_groups": 1, "lr": 1e-6}})
        learner = Learner(model, cfg, codec.pad_id, group_size=2)
        groups = [Group.of(item) for item in lease(args.micro_batches).items]
        took: dict[bool, list[float]] = {False: [], True: []}
        for step in range(2 * (args.steps + 1)):
            overlap = step % 2 == 1
            model.overlap_stages = overlap
            torch.distributed.barrier()
            started = time.perf_counter()
            learner.step(groups)
            if step >= 2:  # the first of each is a warm-up
                took[overlap].append(time.perf_counter() - started)
        if rank == 0:
            results.put(took)
    finally:
        gang.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp:
        directory = tiny_task_model(
            Path(tmp) / "model",
            "qwen3",
            hidden_size=args.hidden,
            intermediate_size=3 * args.hidden,
            num_hidden_layers=args.layers,
            head_dim=64,
            num_attention_heads=args.hidden // 64,
            num_key_value_heads=max(1, args.hidden // 128),
            max_position_embeddings=PROMPT + RESPONSE,
        )
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        port = free_port()
        ranks = start_ranks(rank_main, 2, port, str(directory), args, results)
        took = results.get(timeout=3600)
        for process in ranks:
            process.join(60)
    one, overlapped = statistics.median(took[False]), statistics.median(took[True])
    m = args.micro_batches
    print(
        f"2 stages of {args.layers // 2} layers (hidden {args.hidden}), {m} micro-batches of "
        f"{RESPONSES} x {PROMPT + RESPONSE} tokens, {args.steps} steps each (median):"
    )
    print(f"  one micro-batch at a time: {one:.2f} s/step  {[round(t, 2) for t in took[False]]}")
    print(
        f"  1F1B:                      {overlapped:.2f} s/step  {[round(t, 2) for t in took[True]]}"
    )
    print(f"  1F1B is {one / overlapped:.2f}x as fast; equal stages allow {2 * m / (m + 1):.2f}x")


if __name__ == "__main__":
    main()
