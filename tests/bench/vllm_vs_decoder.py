"""vLLM against asyncrl's own decoder, side by side in one run on the same machine.

    python -m tests.bench.vllm_vs_decoder [--quick] [--reps 5] [--prompts 32]
        [--models embedded,llama-110m] [--runs 3] [--steps 300] [--no-decode] [--no-runs]
        [-c CONFIG] [section.key=value ...]

Two parts, each taking turns between the engines (torch first in the first round, vLLM
first in the second, and so on), so that drift in the machine's load falls on both.

**Decode throughput**, in this process, each engine on one thread: ``--prompts`` prompts of
the config's task (its training split, index 0 up, as the dataloader hands them out), each
sampled ``data.group_size`` times at ``algorithm.temperature`` with up to
``model.max_new_tokens`` new tokens, fed to a decoder of the generate role's 64 slots a
whole group at a time as slots free up (as the generate role claims leases). The own
decoder (:class:`~asyncrl.actors.policy.decoder.Decoder`) and vLLM (an in-process engine
through :class:`~asyncrl.actors.engines.vllm.engine.VLLMDecoder`, set up from
``backends.vllm`` as the generate role sets it up, prefix caching on) decode the same
prompts. Two models: the config's (``embedded``: 4 layers, hidden 128) and ``llama-110m``,
a Llama shape of 12 layers and hidden 768 (113M parameters) with random weights (normal,
standard deviation 0.02, as transformers initializes a Llama) and the config model's
tokenizer, written to a temporary directory. Its next-token distribution is near uniform,
so a response ends at an end-of-sequence token by chance (vLLM refuses an end id outside
the vocabulary, which would have made every response run its budget): tokens/s, not a
round's seconds, is what compares. Start-up and one warm-up round per engine are not
timed; vLLM's prefix cache is emptied before each round, so what it finds there is a
group's samples sharing their prompt's pages (whole pages of ``backends.vllm.block_size``
tokens, 32). Printed per round: tokens/s of each engine, the ratio own/vLLM, vLLM's prompt
tokens found in its prefix cache; then each figure's median and its min-max.

**The default run's wall**: ``asyncrl run -c CONFIG run.total_steps=STEPS
backends.generate=torch`` and ``... backends.generate=vllm``, ``--runs`` rounds, each a
real run (a scheduler and a worker process per role) into its own directory. Printed per
run: its wall-clock seconds, the seconds from its first step to its last (the pace without
the start-up, vLLM's included), its steps and its last validation reward; then per engine
the median and min-max of both times, and the ratios vLLM/torch per round. If this
checkout's config refuses ``backends.generate=vllm``, or vLLM is not installed, the vLLM
runs are skipped with a message and the torch runs still go.

``--quick``, a smoke run: 2 rounds of 8 prompts on the config's model and of 2 prompts of
up to 16 new tokens on ``llama-110m``, then 1 round of 5-step runs (2 min 52 s on the 2-core
VM under other work's load, 2026-11-28; most of it the processes' and vLLM's start-up).

vLLM's CPU settings are taken from the environment where set, else these defaults:
``VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1`` (one thread, unbound),
``VLLM_CPU_KVCACHE_SPACE=1``, ``TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=ERROR``; the runs' processes inherit them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.runtime.contract.config import ConfigError, RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "deploy" / "configs" / "default.yaml"
ENGINES = ("torch", "vllm")
VLLM_ENVIRONMENT = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
}
# The larger model: a Llama shape of about 110M parameters (with the config model's
# vocabulary), where a step's compute outweighs vLLM's per-step overhead.
LARGER = "llama-110m"
LARGER_SHAPE = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
}


# ------------------------------------------------------------------------ decode throughput


@dataclass(frozen=True)
class Model:
    name: str
    directory: Path
    max_new_tokens: int
    prompts: int


@dataclass(frozen=True)
class Round:
    tokens: int
    seconds: float
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    @property
    def per_s(self) -> float:
        return self.tokens / self.seconds


def larger_model(source: Path, target: Path) -> Path:
    """A random-weight Llama of :data:`LARGER_SHAPE` with ``source``'s tokenizer, written to
    ``target`` as a Hugging Face directory (config.json, safetensors, tokenizer files)."""
    import torch

    from asyncrl.actors.policy.checkpoint import save_model
    from asyncrl.actors.policy.config import ModelConfig
    from asyncrl.actors.policy.model import CausalLM

    config = json.loads((source / "config.json").read_text()) | LARGER_SHAPE
    torch.manual_seed(0)
    model = CausalLM(ModelConfig.from_hf(config))
    with torch.no_grad():
        for matrix in (p for p in model.parameters() if p.dim() > 1):
            matrix.normal_(0.0, 0.02)
    save_model(model, source, target)
    return target


def decode_round(decoder: Any, prompts: Sequence[tuple[int, ...]], n: int) -> Round:
    """Every prompt ``n`` times through ``decoder``, a whole group at a time as slots free."""
    from asyncrl.actors.policy.decoder import Request

    waiting = deque(enumerate(prompts))
    tokens = 0
    started = time.perf_counter()
    while waiting or decoder.busy:
        while waiting and decoder.free_slots >= n:
            gid, prompt = waiting.popleft()
            decoder.submit(Request((gid, j), prompt) for j in range(n))
        tokens += sum(len(done.tokens) for done in decoder.step())
    return Round(tokens, time.perf_counter() - started)


def bench_model(model: Model, cfg: RunConfig, rounds: int) -> dict[str, list[Round]]:
    """Both engines on ``model``, taking turns; each round's tokens and seconds."""
    import torch

    from asyncrl.actors.engines.vllm.decoder import VLLMDecoder
    from asyncrl.actors.engines.vllm.engine import start_engine
    from asyncrl.actors.policy.checkpoint import load_model
    from asyncrl.actors.policy.decoder import Decoder
    from asyncrl.actors.roles.generate import DEFAULT_SLOTS
    from asyncrl.actors.workload import load_workload

    torch.set_num_threads(1)  # before vLLM starts: it makes set_num_threads a no-op
    dtype = getattr(torch, cfg.model.dtype)
    own_model, codec = load_model(str(model.directory), dtype)
    context = own_model.config.max_position_embeddings
    max_new = model.max_new_tokens
    max_prompt = min(cfg.model.max_prompt_tokens, context - max_new)
    task = load_workload(cfg)
    prompts = [tuple(codec.encode(task.sample("train", i).prompt)) for i in range(model.prompts)]
    n = cfg.data.group_size
    started = time.perf_counter()
    # As the generate role starts it for backends.generate=vllm (start_vllm).
    engine = start_engine(
        str(model.directory),
        dtype=cfg.model.dtype,
        context_length=min(cfg.model.max_prompt_tokens + max_new, context),
        seed=cfg.run.seed,
        kv_cache_gib=cfg.backends.vllm.kv_cache_gib,
        block_size=cfg.backends.vllm.block_size,
    )
    print(
        f"   vLLM engine started in {time.perf_counter() - started:.1f} s; torch threads "
        f"{torch.get_num_threads()}; prompts of {min(map(len, prompts))}-"
        f"{max(map(len, prompts))} tokens",
        flush=True,
    )
    page = cfg.backends.vllm.block_size  # vLLM's prefix cache shares whole pages
    if max(map(len, prompts)) <= page:
        print(
            f"   (no prompt is longer than a page of vLLM's cache, {page} tokens: a "
            "group's samples have no whole page to share)",
            flush=True,
        )
    common = {"slots": DEFAULT_SLOTS, "max_new_tokens": max_new, "max_prompt_tokens": max_prompt}
    temperature = cfg.algorithm.temperature

    def own(seed: int) -> Round:
        decoder = Decoder(
            own_model,
            **common,
            eos_id=codec.eos_ids,
            pad_id=codec.pad_id,
            temperature=temperature,
            seed=seed,
        )
        with torch.inference_mode():  # as the generate role decodes
            return decode_round(decoder, prompts, n)

    def vllm(seed: int) -> Round:
        # A cold prefix cache each round: only a group's samples share a prompt's pages.
        engine.engine.reset_prefix_cache()
        decoder = VLLMDecoder(
            engine, **common, eos_id=codec.eos_ids, temperature=temperature, seed=seed
        )
        got = decode_round(decoder, prompts, n)
        decoder.close()
        return Round(got.tokens, got.seconds, decoder.prompt_tokens, decoder.cached_prompt_tokens)

    runners: dict[str, Callable[[int], Round]] = {"torch": own, "vllm": vllm}
    for runner in runners.values():
        runner(10_000)  # warm-up, not counted
    results: dict[str, list[Round]] = {name: [] for name in ENGINES}
    try:
        for i in range(rounds):
            for name in ENGINES if i % 2 == 0 else ENGINES[::-1]:
                results[name].append(runners[name](i))
            print_round(i, results)
    finally:
        engine.close()
    return results


def print_round(i: int, results: dict[str, list[Round]]) -> None:
    own, vllm = results["torch"][i], results["vllm"][i]
    print(
        f"   round {i + 1}: own decoder {own.per_s:8,.0f} tokens/s ({own.tokens} in "
        f"{own.seconds:.2f} s)   vLLM {vllm.per_s:8,.0f} tokens/s ({vllm.tokens} in "
        f"{vllm.seconds:.2f} s; prefix cache {vllm.cached_prompt_tokens} of "
        f"{vllm.prompt_tokens} prompt tokens)   own/vLLM {own.per_s / vllm.per_s:.2f}x",
        flush=True,
    )


def spread(values: Sequence[float], spec: str) -> str:
    """Median and min-max of ``values``."""
    return (
        f"{format(statistics.median(values), spec)} "
        f"({format(min(values), spec)}-{format(max(values), spec)})"
    )


def decode_summary(name: str, results: dict[str, list[Round]]) -> None:
    own = [r.per_s for r in results["torch"]]
    vllm = [r.per_s for r in results["vllm"]]
    ratios = [a / b for a, b in zip(own, vllm, strict=True)]
    print(
        f"{name}, {len(own)} round(s), median (min-max): own decoder {spread(own, ',.0f')} "
        f"tokens/s, vLLM {spread(vllm, ',.0f')} tokens/s, own/vLLM {spread(ratios, '.2f')}x",
        flush=True,
    )


def bench_decode(cfg: RunConfig, args: argparse.Namespace) -> None:
    from asyncrl.actors.policy.directories import model_dir

    source = model_dir(cfg.model.path)
    max_new = cfg.model.max_new_tokens
    with tempfile.TemporaryDirectory(prefix="asyncrl-vllm-bench-") as tmp:
        for name in args.models:
            if name == LARGER:
                started = time.perf_counter()
                directory = larger_model(source, Path(tmp) / LARGER)
                print(f"== {name}: written in {time.perf_counter() - started:.1f} s", flush=True)
                model = Model(
                    name,
                    directory,
                    args.larger_new_tokens or max_new,
                    args.larger_prompts or args.prompts,
                )
            else:
                model = Model(name, model_dir(name), max_new, args.prompts)
                print(f"== {name}", flush=True)
            print(
                f"   {model.prompts} prompts x {cfg.data.group_size} samples, up to "
                f"{model.max_new_tokens} new tokens, temperature {cfg.algorithm.temperature}",
                flush=True,
            )
            decode_summary(name, bench_model(model, cfg, args.reps))


# ------------------------------------------------------------------------------- run wall


@dataclass(frozen=True)
class Run:
    engine: str
    wall_s: float
    steps: int
    final_val: float | None
    # From the first step's line in metrics.jsonl to the last's (the scheduler's clock):
    # the pace once both engines run, without the processes' and vLLM's start-up.
    stepping_s: float


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_once(config: Path, engine: str, overrides: list[str], steps: int, work: Path) -> Run:
    run_dir = work / engine
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", str(config)]
    argv += [
        f"run.dir={run_dir}",
        f"run.name={engine}",
        f"run.total_steps={steps}",
        f"backends.generate={engine}",
        "scheduler.control_port=0",
        "scheduler.events_port=0",
        *overrides,
    ]
    started = time.monotonic()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"asyncrl run with backends.generate={engine} exited {proc.returncode}")
    validation = _lines(run_dir / "validation.jsonl")
    metrics = _lines(run_dir / "metrics.jsonl")
    if not metrics:
        raise SystemExit(f"{run_dir}: the run wrote no step to metrics.jsonl")
    return Run(
        engine=engine,
        wall_s=wall,
        steps=len(metrics),
        final_val=validation[-1]["val_reward"] if validation else None,
        stepping_s=metrics[-1]["elapsed_s"] - metrics[0]["elapsed_s"],
    )


def vllm_refusal(config: Path, overrides: list[str]) -> str | None:
    """Why a run with ``backends.generate=vllm`` cannot go here; None if it can."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed in this environment"
    try:
        load_config(config, [*overrides, "backends.generate=vllm"])
    except (ConfigError, ValueError) as refused:
        return f"this checkout's config refuses backends.generate=vllm ({refused})"
    return None


def bench_runs(config: Path, args: argparse.Namespace) -> None:
    engines = list(ENGINES)
    refusal = vllm_refusal(config, args.overrides)
    if refusal is not None:
        print(f"   vLLM runs skipped: {refusal}; the torch runs go alone", flush=True)
        engines.remove("vllm")
    results: dict[str, list[Run]] = {engine: [] for engine in engines}
    for i in range(args.runs):
        for engine in engines if i % 2 == 0 else engines[::-1]:
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix="asyncrl-vllm-bench-run-") as tmp:
                run = run_once(config, engine, args.overrides, args.steps, Path(tmp))
            results[engine].append(run)
            val = "-" if run.final_val is None else f"{run.final_val:.3f}"
            print(
                f"   round {i + 1} {engine:<5}: {run.wall_s:6.1f} s in all, "
                f"{run.stepping_s:6.1f} s from step 1 to {run.steps}, last validation {val} "
                f"(load average {load:.1f} before)",
                flush=True,
            )
    for engine, runs in results.items():
        walls = [r.wall_s for r in runs]
        stepping = [r.stepping_s for r in runs]
        print(
            f"{engine}: {args.steps} steps in {spread(walls, '.1f')} s in all, "
            f"{spread(stepping, '.1f')} s from the first step, median (min-max)"
        )
    if len(results) == len(ENGINES):
        pairs = list(zip(results["torch"], results["vllm"], strict=True))
        walls = [vllm.wall_s / torch.wall_s for torch, vllm in pairs]
        stepping = [vllm.stepping_s / torch.stepping_s for torch, vllm in pairs]
        print(
            f"vLLM/torch per round: in all {', '.join(f'{r:.2f}x' for r in walls)}; "
            f"from the first step {', '.join(f'{r:.2f}x' for r in stepping)}"
        )
    sys.stdout.flush()


# ----------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    parser.add_argument("--reps", type=int, default=5, help="decode rounds per engine and model")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per decode round")
    parser.add_argument(
        "--models",
        default=f"config,{LARGER}",
        help=f"comma-separated: config (model.path), {LARGER}, or model directories",
    )
    parser.add_argument("--larger-prompts", type=int, default=0, help=f"{LARGER}: 0 = --prompts")
    parser.add_argument("--larger-new-tokens", type=int, default=0, help="0: model.max_new_tokens")
    parser.add_argument("--runs", type=int, default=3, help="rounds of runs, one per engine each")
    parser.add_argument("--steps", type=int, default=300, help="run.total_steps of each run")
    parser.add_argument("--no-decode", action="store_true", help="skip the decode throughput")
    parser.add_argument("--no-runs", action="store_true", help="skip the runs' wall")
    parser.add_argument("overrides", nargs="*", help="section.key=value, for both engines")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.prompts, args.runs, args.steps = 2, 8, 1, 5
        args.larger_prompts, args.larger_new_tokens = 2, 16
    for name, value in VLLM_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    cfg = load_config(args.config, args.overrides)
    args.models = [cfg.model.path if m == "config" else m for m in args.models.split(",")]
    print(
        f"#### {args.config} on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M %Z')}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    if not args.no_decode:
        if importlib.util.find_spec("vllm") is None:
            print("decode throughput skipped: vLLM is not installed here", flush=True)
        else:
            print("\n## decode throughput, one thread each", flush=True)
            bench_decode(cfg, args)
    if not args.no_runs:
        print(f"\n## {args.steps}-step runs, {args.runs} round(s)", flush=True)
        bench_runs(args.config, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
