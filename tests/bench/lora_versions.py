"""LoRA against full fine-tuning on the same model: what a version weighs and costs.

    python -m tests.bench.lora_versions [--layers 8] [--hidden 512] [--vocab 16000]
        [--versions 4] [--rank 16] [--targets q_proj,v_proj,...] [--strategy ucx-map|ucx|shm]
        [--repeats 1]

For each of full fine-tuning and LoRA (``--rank``, adapters on ``--targets``: every
linear layer by default), two fresh processes (spawn): a trainer, the project's Learner
on a random Llama-shaped model, and a generator holding the same base. The trainer
trains one step on a fixed synthetic batch, takes the version (``full_weights``: every
weight, or the adapters alone) and publishes it through the weight plane
(``--strategy``, 64 MiB buckets, checksummed); the generator fetches it with the role's
receiver and applies it (full: runs on the received buffers; LoRA: merges the adapters
onto the base it keeps). Then the next step, ``--versions`` times; the first version is
not counted (the plane sizes its buffers then).

Then, in this process on one thread, decode steps of 4 sequences (``--decode-steps``)
on the base with the adapters merged against peft's separate low-rank products on every
token: where merging a version costs less than the steps decoded under it would lose,
merging is the faster way to apply a version.

Printed side by side, all measured in this run (medians, with min-max over the versions
and repeats): bytes per version; gather s (the version taken from the learner), publish s
(staged into the plane's buffer), transfer s (at the generator, plan to last checked
byte), apply s (into the generator's model); and the trainer's peak resident memory
above its baseline while it trained and published (Linux VmHWM).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time

import torch

from tests.bench.train_memory import _reset_peak, _rss_kib, llama_shape, synthetic_lease
from tests.bench.weight_stall import _publisher, _receiver

_ALL_LINEARS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def _config(lora: dict | None):
    from asyncrl.runtime.contract.config import config_from_dict

    return config_from_dict({"algorithm": {"micro_batch_groups": 1}, "model": {"lora": lora or {}}})


def _trainer(shape: dict, lora: dict | None, args: dict, workdir: str, plans, acks, out) -> None:
    import peft  # noqa: F401  loaded before the baseline in both modes: code, not training

    from asyncrl.actors.policy.lora import add_adapters
    from asyncrl.actors.policy.model import CausalLM, ModelConfig
    from asyncrl.actors.training.learner import Group, Learner
    from asyncrl.transport.weights import WeightsPlan

    torch.set_num_threads(1)
    baseline = _rss_kib("VmRSS")
    _reset_peak()
    torch.manual_seed(0)
    cfg = _config(lora)
    model = CausalLM(ModelConfig(**shape))
    if lora:
        add_adapters(model, cfg.model.lora)
    learner = Learner(model, cfg, pad_id=0)
    lease = synthetic_lease(shape["vocab_size"], 32, 64)
    groups = [Group.of(item) for item in lease.items]
    publisher = _publisher(args["strategy"], workdir)
    publisher.prepare(learner.full_weights())
    rows = []
    for version in range(1, args["versions"] + 1):
        learner.step(groups)
        started = time.perf_counter()
        state = learner.full_weights()
        gathered = time.perf_counter()
        announcement = publisher.publish(version, state)
        published = time.perf_counter()
        plans.put(WeightsPlan(version, announcement.manifest, "trainer", announcement.address))
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        rows.append((nbytes, gathered - started, published - gathered, *acks.get(timeout=600)))
    peak = (_rss_kib("VmHWM") - baseline) / 1024
    params = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    out.put((rows, peak, params))
    publisher.close()


def _generator(shape: dict, lora: dict | None, args: dict, workdir: str, plans, acks) -> None:
    from asyncrl.actors.policy.adapters import MergedAdapters
    from asyncrl.actors.policy.checkpoint import load_state
    from asyncrl.actors.policy.model import CausalLM, ModelConfig
    from asyncrl.transport.weights import Received

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**shape)).requires_grad_(False)
    if lora:
        model.adapters = MergedAdapters(model, lora["target_modules"], lora["alpha"] / lora["rank"])
    receiver = _receiver(args["strategy"], workdir)
    for _ in range(args["versions"]):
        plan = plans.get(timeout=600)
        started = time.perf_counter()
        receiver.want(plan)
        received = receiver.poll()
        while not isinstance(received, Received):
            time.sleep(0.0005)
            received = receiver.poll()
        arrived = time.perf_counter()
        load_state(model, received.state, copy=False)
        applied = time.perf_counter()
        receiver.loaded(received)
        acks.put((arrived - started, applied - arrived, received.nbytes))
    receiver.close()


def _measure(shape: dict, lora: dict | None, args: dict) -> tuple[list, float, int]:
    ctx = mp.get_context("spawn")
    plans, acks, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="asyncrl-lora-bench-") as workdir:
        common = (shape, lora, args, workdir, plans, acks)
        trainer = ctx.Process(target=_trainer, args=(*common, out))
        generator = ctx.Process(target=_generator, args=common)
        trainer.start()
        generator.start()
        rows, peak, params = out.get(timeout=1800)
        trainer.join(60)
        generator.join(60)
    if trainer.exitcode or generator.exitcode:
        raise SystemExit(f"a process failed: {trainer.exitcode}, {generator.exitcode}")
    if any(row[0] != row[5] for row in rows):
        raise SystemExit(f"the generator received other bytes than published: {rows}")
    return rows[1:], peak, params  # the first version sizes the plane's buffers


def _decode_step_s(shape: dict, lora: dict | None, steps: int) -> list[float]:
    """Seconds per decode step (4 sequences, one token each) of the base model with the
    adapters merged (``lora`` None: what a generator merging them runs) or kept apart as
    peft's low-rank products on every token."""
    from asyncrl.actors.policy.decoder import Decoder, Request
    from asyncrl.actors.policy.lora import add_adapters
    from asyncrl.actors.policy.model import CausalLM, ModelConfig

    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**shape))
    if lora:
        add_adapters(model, _config(lora).model.lora)
        for name, param in model.named_parameters():
            if "lora_B" in name:  # nonzero, as after training: every product is computed
                param.data.normal_(0, 0.01)
    model.requires_grad_(False).eval()
    decoder = Decoder(model, slots=4, max_new_tokens=steps + 8, max_prompt_tokens=16,
                      eos_id=-1, pad_id=0, seed=1)  # fmt: skip
    decoder.submit([Request(tag, tuple(range(1, 17))) for tag in range(4)])
    decoder.step()  # the prompts: not a decode step
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        decoder.step()
        times.append(time.perf_counter() - started)
    return times


def _spread(values: list[float], scale: float = 1.0, digits: int = 4) -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}-{max(v):.{digits}f}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", default=_ALL_LINEARS)
    parser.add_argument("--strategy", choices=("ucx", "ucx-map", "shm"), default="ucx-map")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--decode-steps", type=int, default=64)
    args = parser.parse_args(argv)
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))  # RSS = memory in use
    shape = llama_shape(args.layers, args.hidden, args.vocab)
    lora = {"rank": args.rank, "alpha": 2.0 * args.rank, "target_modules": args.targets.split(",")}
    settings = {"versions": args.versions + 1, "strategy": args.strategy}
    modes = {"full": None, f"lora r={args.rank}": lora}
    results: dict[str, tuple[list, list, int]] = {name: ([], [], 0) for name in modes}
    for _ in range(args.repeats):
        for name, spec in modes.items():
            rows, peak, params = _measure(shape, spec, settings)
            results[name][0].extend(rows)
            results[name][1].append(peak)
            results[name] = (*results[name][:2], params)
    torch.set_num_threads(1)
    merged_steps = _decode_step_s(shape, None, args.decode_steps)
    apart_steps = _decode_step_s(shape, lora, args.decode_steps)
    print(
        f"lora_versions: {os.cpu_count()} CPUs; a {args.layers}-layer, {args.hidden}-wide "
        f"model, vocabulary {args.vocab}; weights.strategy={args.strategy}; "
        f"{args.versions} versions x {args.repeats} repeats; lora targets {args.targets}"
    )
    columns = ("", "trained params", "bytes/version", "gather s", "publish s", "transfer s")
    print(" | ".join((*columns, "apply s", "trainer peak MiB")))
    for name, (rows, peaks, params) in results.items():
        cells = [name, f"{params / 1e6:.2f}M", f"{rows[0][0]:,}"]
        cells += [_spread([r[i] for r in rows]) for i in (1, 2, 3, 4)]
        cells.append(_spread(peaks, digits=0))
        print(" | ".join(cells))
    merge_s = statistics.median(r[4] for r in results[f"lora r={args.rank}"][0])
    merged, apart = statistics.median(merged_steps), statistics.median(apart_steps)
    print(
        f"decode step, 4 sequences, one thread ({args.decode_steps} steps): adapters merged "
        f"{_spread(merged_steps, 1e3, 2)} ms, as separate low-rank products "
        f"{_spread(apart_steps, 1e3, 2)} ms"
    )
    if apart > merged:
        print(
            f"merging a version ({merge_s * 1e3:.1f} ms) pays for itself after "
            f"{merge_s / (apart - merged):.0f} decode steps under that version"
        )


if __name__ == "__main__":
    main()
