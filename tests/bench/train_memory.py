"""Each training rank's memory with 1 and 2 ranks, for a ~100M-parameter model.

    python -m tests.bench.train_memory [--layers 12] [--hidden 768] [--vocab 16000]
        [--steps 2] [--micro-batch-groups 1] [--prompt-tokens 32] [--response-tokens 64]
        [--gradient-checkpointing]

The trainer's own code (the Learner: FSDP2 over gloo with 2 ranks) trains a random
Llama-shaped model on a fixed synthetic batch, in real processes (spawn). Each rank builds
the whole model, shards it (2 ranks), then resets its peak resident memory (Linux
``/proc/self/clear_refs``) and trains ``--steps`` optimizer steps: the peak it reports is
what training holds at its highest (parameters, gradients, AdamW state, activations, the
layer being all-gathered), above what the process held before the model existed
(Python, torch). Loading is reported apart: every rank reads the whole model before
sharding it, as a rank of the trainer does.

The batch is 4 groups of 4 responses (``--prompt-tokens`` + ``--response-tokens`` each),
in micro-batches of ``--micro-batch-groups`` groups: activations are not sharded (each rank
runs whole micro-batches), so they are the part of the peak that 2 ranks do not halve;
``--gradient-checkpointing`` (model.gradient_checkpointing) keeps only each layer's input.

Printed: per rank, the peak during training and during loading (MiB above the baseline),
what its parameters, gradients and AdamW state take (summed from the tensors it holds, for
comparison), and the ratio of a 2-rank rank's training peak to the 1-rank peak. Numbers
are measured here, in this run; nothing is assumed.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os

import numpy as np
import torch

from tests.support.ranks import GROUP_SECRET, free_port, start_ranks

_BATCH_GROUPS, _RESPONSES = 4, 4


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    ctypes.CDLL(None).malloc_trim(0)  # memory freed so far leaves the process first
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM, the peak resident set size, to the current one


def synthetic_lease(
    vocab: int,
    prompt_tokens: int,
    response_tokens: int,
    groups: int = _BATCH_GROUPS,
    responses: int = _RESPONSES,
):
    """A train lease of ``groups`` random groups, every response ``response_tokens`` long."""
    from asyncrl.runtime.contract.stages import Role
    from asyncrl.transport import protocol as p

    rng = np.random.default_rng(0)
    items = []
    for gid in range(groups):
        longest = response_tokens
        logprobs = -rng.random((responses, longest), dtype=np.float32)
        data = {
            Role.GENERATE.value: {
                "prompt_ids": rng.integers(3, vocab, size=prompt_tokens).astype(np.int32),
                "response_ids": rng.integers(3, vocab, size=(responses, longest)).astype(np.int32),
                "lengths": np.full(responses, longest, np.int32),
                "logprobs": logprobs,
                "versions": np.zeros((responses, longest), np.int32),
                "truncated": np.zeros(responses, np.uint8),
            },
            Role.LOGP.value: {"logprobs": logprobs, "version": 0},
            Role.REWARD.value: {"rewards": rng.integers(0, 2, responses).astype(np.float32)},
        }
        items.append(p.Item(gid, f"g{gid}", data))
    return p.Lease(1, 1, Role.TRAIN.value, 60.0, 0, tuple(items))


def _rank(rank: int, size: int, port: int, shape: dict, batch: dict, out) -> None:
    torch.set_num_threads(1)
    from asyncrl.actors.policy.model import CausalLM, ModelConfig
    from asyncrl.actors.training.gang import Gang
    from asyncrl.actors.training.learner import Group, Learner
    from asyncrl.runtime.contract.config import config_from_dict
    from asyncrl.runtime.contract.gangs import GangPlace

    gang = Gang(GangPlace(rank, size, "127.0.0.1", port), secret=GROUP_SECRET) if size > 1 else None
    baseline = _rss_kib("VmRSS")
    _reset_peak()
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**shape))
    model.gradient_checkpointing = batch["gradient_checkpointing"]
    params = sum(t.numel() for t in model.parameters())
    cfg = config_from_dict({"algorithm": {"micro_batch_groups": batch["micro_batch_groups"]}})
    learner = Learner(model, cfg, pad_id=0, group_size=size)
    del model
    loading_peak = _rss_kib("VmHWM") - baseline
    lease = synthetic_lease(shape["vocab_size"], batch["prompt_tokens"], batch["response_tokens"])
    groups = [Group.of(item) for item in lease.items]
    _reset_peak()
    for _ in range(batch["steps"]):
        learner.step(groups)
    training_peak = _rss_kib("VmHWM") - baseline
    held = _state_bytes(learner) // 1024
    out.put((size, rank, params, loading_peak, training_peak, held))
    if gang is not None:
        gang.close()


def _state_bytes(learner) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state (its shards) while
    a step runs (between steps the gradients are freed)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = 0
    for param in learner.model.parameters():
        total += 2 * local(param).nbytes  # its gradient, while a step runs, is as large
    for state in learner.optimizer.state.values():
        total += sum(local(v).nbytes for v in state.values() if isinstance(v, torch.Tensor))
    return total


def _measure(size: int, shape: dict, batch: dict) -> list[tuple]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    port = free_port()
    ranks = start_ranks(_rank, size, size, port, shape, batch, out)
    results = [out.get(timeout=1800) for _ in ranks]
    for process in ranks:
        process.join(60)
        if process.exitcode != 0:
            raise SystemExit(f"a rank of the {size}-rank group failed ({process.exitcode})")
    return sorted(results)


def llama_shape(layers: int, hidden: int, vocab: int) -> dict:
    """A Llama-family model's config, sized by ``layers``, ``hidden`` and ``vocab`` (64-wide
    heads, the MLP 8/3 of ``hidden``): the shape the memory benches build."""
    heads = hidden // 64
    return dict(
        architecture="LlamaForCausalLM",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3 // 64 * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        attention_bias=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro-batch-groups", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--response-tokens", type=int, default=64)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    batch = {
        "steps": args.steps,
        "micro_batch_groups": args.micro_batch_groups,
        "prompt_tokens": args.prompt_tokens,
        "response_tokens": args.response_tokens,
        "gradient_checkpointing": args.gradient_checkpointing,
    }
    shape = llama_shape(args.layers, args.hidden, args.vocab)
    # Large blocks straight from and back to the kernel, so that resident memory is memory
    # in use, not blocks glibc keeps cached after torch freed them (children inherit it).
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    print(
        f"train_memory: {os.cpu_count()} CPUs; {args.steps} steps of {_BATCH_GROUPS} groups x "
        f"{_RESPONSES} responses of {args.prompt_tokens}+{args.response_tokens} tokens, "
        f"micro-batches of {args.micro_batch_groups} groups, activations "
        f"{'recomputed' if args.gradient_checkpointing else 'kept'}"
    )
    rows = _measure(1, shape, batch) + _measure(2, shape, batch)
    params = rows[0][2]
    print(f"model: {params / 1e6:.1f}M parameters (fp32), AdamW")
    header = f"{'ranks':>5} {'rank':>4} {'training peak MiB':>18} {'loading peak MiB':>17}"
    print(f"{header} {'params+grads+AdamW MiB':>23}")
    for size, rank, _, loading, training, held in rows:
        print(
            f"{size:>5} {rank:>4} {training / 1024:>18.0f} {loading / 1024:>17.0f} "
            f"{held / 1024:>23.0f}"
        )
    one = rows[0][4]
    worst_two = max(r[4] for r in rows if r[0] == 2)
    print(f"2-rank training peak / 1-rank: {worst_two / one:.2f}")


if __name__ == "__main__":
    main()
