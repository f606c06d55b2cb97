"""What the engines do on one CUDA device with a model of Qwen2-0.5B's shape.

    python -m tests.bench.cuda_figures [--layers 24] [--slots 64 256] [--steps 3]
        [--engines torch megatron] [--profile]

The model is random (no download): Qwen2-0.5B's configuration (24 layers, hidden 896,
14 query and 2 key/value heads, vocabulary 151,936, tied embeddings, attention bias), in
bfloat16 on the device. Printed, each measured here in this run:

- **decode**: the generate role's continuous-batching decoder (actors/policy/decoder.py)
  with ``--slots`` sequences at a time, prompts of 128 tokens and 256 sampled tokens
  each: generated tokens per second of wall time, prompt processing included, with every
  kernel launched from Python and with one-token steps replayed from CUDA graphs;
- **load**: a new version from page-locked CPU memory into the generator's model;
- **train step**, per training engine (``--engines``: the torch engine, and megatron-core's
  GPTModel holding the same weights): the trainer's own code (the Learner: float32 master
  weights, bfloat16 autocast, AdamW) on a lease of 8 groups x 8 responses of 128 + 384
  tokens, in micro-batches of 2 groups: seconds per optimizer step and model FLOPs
  utilisation, 6 x (parameters in matrix products) x tokens / time / the device's dense
  bfloat16 peak (attention's own products left out, so the figure is a floor);
- **train step, output layer in 1 GiB chunks**: the torch engine again with the output
  layer's log-probs made 2**28 logits at a time (recomputed in backward), below the
  default threshold for this batch: peak memory against time;
- **gather + stage**: a new version from the trainer's GPU into CPU memory (the gather,
  page-locked as the Learner does it, and pageable for comparison), then into the weight
  plane's shared-memory staging buffer with its checksums (the stage).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tests.bench.train_memory import synthetic_lease

_PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def _qwen2_half_billion(layers: int, vocab: int) -> dict:
    return dict(
        architecture="Qwen2ForCausalLM",
        vocab_size=vocab,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attention_bias=True,
    )


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _decode(model, slots: int, new_tokens: int, graphs: bool) -> tuple[float, int]:
    from asyncrl.actors.policy.decoder import Decoder, Request

    vocab = model.config.vocab_size
    decoder = Decoder(
        model,
        slots=slots,
        max_new_tokens=new_tokens,
        max_prompt_tokens=128,
        eos_id=vocab - 1,
        pad_id=0,
        cuda_graphs=graphs,
    )
    generator = torch.Generator().manual_seed(slots)
    prompts = torch.randint(3, vocab - 1, (slots, 128), generator=generator)
    decoder.submit(Request(i, tuple(prompts[i].tolist())) for i in range(slots))
    _sync()
    started = time.perf_counter()
    tokens = 0
    while decoder.busy:
        tokens += sum(len(done.tokens) for done in decoder.step())
    _sync()
    return time.perf_counter() - started, tokens


def _profile_decode(model, slots: int, graphs: bool) -> None:
    """Where a decode step's time goes: the busiest operators of 20 steps mid-generation."""
    from torch.profiler import ProfilerActivity, profile

    from asyncrl.actors.policy.decoder import Decoder, Request

    vocab = model.config.vocab_size
    decoder = Decoder(
        model,
        slots=slots,
        max_new_tokens=64,
        max_prompt_tokens=128,
        eos_id=vocab - 1,
        pad_id=0,
        cuda_graphs=graphs,
    )
    decoder.submit(Request(i, tuple(range(3, 131))) for i in range(slots))
    for _ in range(10):
        decoder.step()
    _sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            decoder.step()
        _sync()
    print(f"profile of 20 decode steps, {slots} slots, graphs {'on' if graphs else 'off'}:")
    for key in ("self_cpu_time_total", "self_device_time_total"):
        print(prof.key_averages().table(sort_by=key, row_limit=12))


def _train(model, steps: int) -> tuple[list[float], int]:
    from asyncrl.actors.training.learner import Group, Learner
    from asyncrl.runtime.contract.config import config_from_dict

    cfg = config_from_dict(
        {
            "algorithm": {"micro_batch_groups": 2},
            "model": {"dtype": "bfloat16", "max_new_tokens": 384},
        }
    )
    learner = Learner(model, cfg, pad_id=0)
    lease = synthetic_lease(model.config.vocab_size, 128, 384, groups=8, responses=8)
    groups = [Group.of(item) for item in lease.items]
    times = []
    for _ in range(steps + 1):  # the first pays for kernel selection and allocation
        _sync()
        started = time.perf_counter()
        learner.step(groups)
        _sync()
        times.append(time.perf_counter() - started)
    return times[1:], len(groups) * 8 * (128 + 384)


def _megatron_twin(master, device: torch.device):
    """The same float32 weights held by the megatron engine (one rank: no split)."""
    from asyncrl.actors.engines.megatron.gpt_build import ParallelSizes, build_gpt
    from asyncrl.actors.engines.megatron.model import MegatronLM
    from asyncrl.actors.policy.checkpoint import state_for_saving

    sizes = ParallelSizes()
    twin = MegatronLM(master.config, build_gpt(master.config, torch.float32, device, sizes), sizes)
    twin.load_hf_state(state_for_saving(master))
    return twin


def _report_load(serving) -> None:
    """A new version into the generator: the decoder's load between two steps, from
    page-locked CPU memory (where the weight plane's receiver leaves it)."""
    from asyncrl.actors.policy.checkpoint import state_for_saving
    from asyncrl.actors.policy.decoder import Decoder

    decoder = Decoder(serving, slots=8, max_new_tokens=8, max_prompt_tokens=8, eos_id=1, pad_id=0)
    state = {n: t.to("cpu").pin_memory() for n, t in state_for_saving(serving).items()}
    times = []
    for version in (1, 2, 3):
        _sync()
        started = time.perf_counter()
        decoder.load(state, version)
        _sync()
        times.append(time.perf_counter() - started)
    mib = sum(t.nbytes for t in state.values()) / 2**20
    print(f"load    {mib:.0f} MiB into the generator: {statistics.median(times) * 1e3:.0f} ms")


def _end_megatron_groups() -> None:
    """megatron's groups and the one-rank group under them, made by ``_megatron_twin``."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _report_train(engine: str, times: list[float], tokens: int, in_products: int, peak, device):
    step = statistics.median(times)
    flops = 6 * in_products * tokens / step
    mfu = f", MFU {flops / peak:.1%} of {peak / 1e12:.0f} TFLOP/s" if peak else ""
    print(
        f"train   {engine:<8} {tokens} tokens/step: {step:.3f} s/step (median of {len(times)}), "
        f"{tokens / step:,.0f} tokens/s, {flops / 1e12:.0f} TFLOP/s{mfu}; "
        f"peak GPU memory {_peak_gib(device):.1f} GiB"
    )


def _gather_and_stage(learner_weights, model) -> dict[str, float]:
    from asyncrl.actors.policy.checkpoint import state_for_saving
    from asyncrl.transport.weights.shm import ShmPublisher

    out: dict[str, float] = {}
    on_device = state_for_saving(model)
    for _ in range(3):  # the last of each: the Learner's two page-locked sets made
        _sync()
        started = time.perf_counter()
        pageable = {name: t.to("cpu") for name, t in on_device.items()}
        out["gather_pageable_s"] = time.perf_counter() - started
        del pageable
        _sync()
        started = time.perf_counter()
        pinned = learner_weights()
        out["gather_pinned_s"] = time.perf_counter() - started
    with tempfile.TemporaryDirectory(dir="/dev/shm") as directory:
        publisher = ShmPublisher(Path(directory) / "weights")
        for version in (1, 2, 3):
            started = time.perf_counter()
            publisher.publish(version, pinned)
            out["stage_s"] = time.perf_counter() - started
        publisher.close()
    out["bytes"] = sum(t.nbytes for t in pinned.values())
    return out


def _peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--slots", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    parser.add_argument("--profile", action="store_true", help="where decode steps spend time")
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["torch", "megatron"],
        choices=["torch", "megatron"],
        help="training engines to time side by side on the same batch (megatron-core needed)",
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("cuda_figures: torch sees no CUDA device")
    from asyncrl.actors.policy.model import CausalLM, ModelConfig
    from asyncrl.actors.training.learner import Learner
    from asyncrl.runtime.contract.config import config_from_dict

    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = next((v for k, v in _PEAK_BF16.items() if k in name), None)
    print(f"cuda_figures: {name}, torch {torch.__version__}")
    torch.manual_seed(0)
    config = ModelConfig(**_qwen2_half_billion(args.layers, args.vocab))
    master = CausalLM(config).to(device)  # float32: the trainer's master weights
    params = sum(t.numel() for t in master.parameters())
    embedding = master.model.embed_tokens.weight.numel()
    # Tied: the embedding's one matrix is also the output layer's product.
    in_products = params - (0 if config.tie_word_embeddings else embedding)
    print(f"model: random Qwen2-0.5B shape, {params / 1e6:.0f}M parameters, bfloat16")

    serving = CausalLM(config).to(torch.bfloat16).to(device).eval()
    serving.load_state_dict(master.state_dict())
    _decode(serving, 8, 8, graphs=False)  # warm-up
    for slots in args.slots:
        # Side by side: every kernel launched from Python, then steps replayed from CUDA
        # graphs (whose first use of each batch size pays for its capture, counted here).
        for graphs in (False, True):
            seconds, tokens = _decode(serving, slots, args.new_tokens, graphs)
            print(
                f"decode  slots={slots:<4} graphs={'on ' if graphs else 'off'} {tokens} tokens "
                f"in {seconds:.2f} s: {tokens / seconds:,.0f} tokens/s "
                f"({seconds / args.new_tokens * 1e3:.1f} ms/step)"
            )
    if device.type == "cuda":
        _report_load(serving)
    if args.profile:
        for graphs in (False, True):
            _profile_decode(serving, args.slots[-1], graphs)
    del serving
    if device.type == "cuda":
        torch.cuda.empty_cache()

    times, tokens = _train(master, args.steps)
    _report_train("torch", times, tokens, in_products, peak, device)
    # The output layer's log-probs in 1 GiB chunks (below the default's threshold for this
    # batch): the memory it saves against the recompute it costs, side by side.
    from asyncrl.actors.policy import model as model_module

    default_chunk = model_module.HEAD_CHUNK_ELEMENTS
    model_module.HEAD_CHUNK_ELEMENTS = 2**28
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, tokens = _train(master, args.steps)
    _report_train("torch,1GiB-chunks", times, tokens, in_products, peak, device)
    model_module.HEAD_CHUNK_ELEMENTS = default_chunk
    if "megatron" in args.engines:
        twin = _megatron_twin(master, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times, tokens = _train(twin, args.steps)
        _report_train("megatron", times, tokens, in_products, peak, device)
        del twin
        _end_megatron_groups()
    cfg = config_from_dict({"model": {"dtype": "bfloat16"}})
    learner = Learner(master, cfg, pad_id=0)
    moved = _gather_and_stage(learner.full_weights, master)
    mib = moved["bytes"] / 2**20
    print(
        f"weights {mib:.0f} MiB bfloat16: gather {moved['gather_pinned_s'] * 1e3:.0f} ms "
        f"page-locked ({moved['gather_pageable_s'] * 1e3:.0f} ms pageable), "
        f"stage {moved['stage_s'] * 1e3:.0f} ms into shared memory with checksums"
    )


if __name__ == "__main__":
    main()
