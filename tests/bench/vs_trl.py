"""asyncrl against TRL's ``GRPOTrainer``: one model, one task, one set of hyperparameters.

    python -m tests.bench.vs_trl [--variant default|long_tail|both|CONFIG] [--pairs 2]
        [--steps N] [--target 0.8] [--without-trl] [--trl-threads N] [--record FILE]
        [--engine torch|vllm] [section.key=value ...]

Three contenders train the config's model on its task, one at a time, each with the whole
machine:

- ``TRL``: ``trl.GRPOTrainer`` in a process of its own (:mod:`tests.bench._trl_grpo`),
  torch on every core (``--trl-threads`` to change that);
- ``asyncrl``: ``asyncrl run`` with the config as it is (a scheduler and six worker
  processes, one torch thread each);
- ``asyncrl sync``: the same with ``pipeline.max_staleness=0``.

Both asyncrl contenders generate with ``backends.generate`` of ``--engine`` (``torch``, the
own decoder, by default; ``vllm`` where this checkout has it: on the embedded models the own
decoder decoded faster, tests/bench/vllm_vs_decoder.py). TRL generates with transformers
(``use_vllm=False``) either way.

A variant is a config: ``default`` is ``deploy/configs/default.yaml`` (long addition of up
to 6 digits on the embedded model, responses of 11 to 62 tokens, 80 new tokens at most),
``long_tail`` is ``deploy/configs/long_tail.yaml`` (up to 30 digits on ``embedded-long``,
responses of 11 to 302 tokens, half of them 41 or shorter, 320 new tokens at most); any
other config file may be named. Overrides apply to every contender.

The config maps onto TRL as follows: a step is ``pipeline.train_batch_groups`` prompts x
``data.group_size`` completions, generated once and trained in micro-batches of
``algorithm.micro_batch_groups`` prompts (``per_device_train_batch_size`` x
``gradient_accumulation_steps``, ``num_iterations=1``); learning rate constant, AdamW
betas 0.9/0.99, no weight decay; ``epsilon`` and ``epsilon_high`` from the clip bounds;
``loss_type="dapo"`` for the token mean over the whole step's batch (``"grpo"`` for a
per-sequence mean); ``beta`` = ``kl_coef`` (0: no reference model); same temperature,
``max_completion_length``, gradient clip and seed; prompts in index order
(``shuffle_dataset=False``), tokenised with the model's own ``tokenizer.json`` (no chat
template, no added tokens) and completions decoded as asyncrl decodes them. What does not
map: TRL standardises rewards with the sample standard deviation (plus 1e-4), asyncrl with
the population one (plus 1e-6), so TRL's advantages are sqrt(7/8) of asyncrl's for groups
of 8, a scale AdamW all but cancels; asyncrl's off-policy correction has nothing to
correct in TRL, which is on-policy.

**Validation, timed apart.** Neither contender validates inside its run. Each keeps the
weights every ``data.val_every_versions`` steps (10) and after the last: TRL through a
callback that writes the state dict to a file (its time is taken out of TRL's training
time), asyncrl through its own checkpoints (``pipeline.checkpoint_every``; the run has
``data.val_every_versions=0``). The trainer writes a checkpoint (weights, optimizer state,
counters: 9 MB, about 50 ms here) inside its step, so that cost stays in asyncrl's time.
Checkpoints are never pruned; each run's directory is deleted once scored. After each run,
one evaluator here scores every snapshot the way asyncrl's generator validates: asyncrl's
greedy decoder, the first ``data.val_prompts`` (128) validation prompts, the task's
reward.

**Training time.** TRL: from ``on_train_begin`` to each step's ``on_step_end``, less the
snapshots. asyncrl: from the moment the generator has loaded the base model (the first
moment any RL work can start; from its log) to each step's line in ``metrics.jsonl`` (the
scheduler's clock). Imports, model loading and, for asyncrl, the start of seven processes
are outside it; the whole process's wall time is its own column.

Printed per variant, medians over the pairs: training seconds to the first validation at
or above ``--target`` and to the third in a row at or above it, training seconds for all
the steps, the whole process's seconds, the final validation reward, seconds per step and
the mean training reward of the last 10 steps; then the ratios of the times: TRL over each
asyncrl contender, and asyncrl sync over asyncrl. The contenders take turns in the order
TRL, asyncrl, asyncrl sync, reversed on every other pair (ABC CBA ABC ...), so drift on a
shared machine falls on all of them. ``--record FILE`` appends each run's figures to a
JSON-lines file as it finishes.

Without TRL installed (``pip install -e '.[peer]'``) the bench says how to install it and
runs the two asyncrl contenders only (``--without-trl`` does so on purpose).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from asyncrl.runtime.contract.config import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {
    "default": ROOT / "deploy" / "configs" / "default.yaml",
    "long_tail": ROOT / "deploy" / "configs" / "long_tail.yaml",
}
INSTALL_HINT = "TRL is not installed: pip install -e '.[peer]' (trl 1.16.0 and what it needs)"
TAIL_STEPS = 10  # the training reward is averaged over this many last steps


@dataclass(frozen=True)
class Contender:
    name: str
    trl: bool = False
    overrides: tuple[str, ...] = ()


CONTENDERS = (
    Contender("TRL", trl=True),
    Contender("asyncrl"),
    Contender("asyncrl sync", overrides=("pipeline.max_staleness=0",)),
)


@dataclass
class Run:
    """One contender's run: training seconds at each step, where its snapshots are."""

    steps: int
    wall_s: float
    train_s: dict[int, float]  # step → training seconds at its end
    rewards: dict[int, float]  # step → mean training reward
    snapshots: dict[int, Path] = field(default_factory=dict)  # step → weights file
    validation: dict[int, float] = field(default_factory=dict)  # step → reward

    def record(self, **about: Any) -> dict[str, Any]:
        return about | asdict(self) | {"snapshots": sorted(self.snapshots)}


# ---------------------------------------------------------------------------------- runs


def run_trl(
    cfg_path: Path, overrides: list[str], steps: int, every: int, work: Path, threads: int
) -> Run:
    out = work / "trl"
    argv = [sys.executable, "-m", "tests.bench._trl_grpo", "-c", str(cfg_path)]
    argv += ["--steps", str(steps), "--out", str(out), "--snapshot-every", str(every)]
    argv += ["--threads", str(threads)]
    env = os.environ | {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    wall = _run(argv + overrides, out.with_suffix(".log"), env=env)
    lines = _lines(out / "steps.jsonl")
    rewards = json.loads((out / "rewards.json").read_text())
    return Run(
        steps=steps,
        wall_s=wall,
        train_s={line["step"]: line["train_s"] for line in lines},
        rewards={int(step): value for step, value in rewards.items()},
        snapshots={int(p.stem.split("-")[1]): p for p in (out / "snapshots").glob("step-*")},
    )


def run_asyncrl(
    cfg_path: Path, overrides: list[str], steps: int, every: int, work: Path, name: str
) -> Run:
    run_dir = work / "asyncrl"
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c", str(cfg_path)]
    argv += [
        f"run.dir={run_dir}",
        f"run.name={name.replace(' ', '-')}",
        f"run.total_steps={steps}",
        "data.val_every_versions=0",
        f"pipeline.checkpoint_every={every}",
        "scheduler.control_port=0",
        "scheduler.events_port=0",
        "logging.format=json",
    ]
    wall = _run(argv + overrides, work / "asyncrl.log")
    began = _generator_ready_s(run_dir / "logs")
    metrics = _lines(run_dir / "metrics.jsonl")
    checkpoints = {
        int(p.name.split("-")[1]): p / "model.safetensors"
        for p in (run_dir / "checkpoints").glob("step-*")
    }
    return Run(
        steps=steps,
        wall_s=wall,
        train_s={m["step"]: round(m["elapsed_s"] - began, 4) for m in metrics},
        rewards={m["step"]: m["reward_mean"] for m in metrics},
        snapshots=checkpoints,
    )


def _run(argv: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"{' '.join(argv[:4])} ... exited with {proc.returncode}")
    return wall


def _generator_ready_s(logs: Path) -> float:
    """Seconds from the scheduler's start to the generator's base model being loaded.

    From the two processes' log timestamps: ``scheduler listening`` (a few milliseconds
    after the scheduler's clock starts: the measured training time comes out that much
    longer) and the generator's first ``loaded a policy version``.
    """
    listening = _first_time(logs / "scheduler.log", "scheduler listening")
    ready = _first_time(logs / "generate-0.log", "loaded a policy version")
    return (ready - listening).total_seconds()


def _first_time(log: Path, event: str) -> datetime:
    for text in log.read_text().splitlines():
        # A process's log holds our JSON lines and whatever a library writes to its stderr
        # (vLLM's own log and warnings, with backends.generate=vllm): those are skipped.
        with contextlib.suppress(ValueError):
            line = json.loads(text)
            if isinstance(line, dict) and line.get("event") == event:
                return datetime.fromisoformat(line["timestamp"])
    raise SystemExit(f"{log}: no {event!r} line")


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------- validation


class Evaluator:
    """Scores weights as asyncrl's generator validates: greedy, the same prompts and reward."""

    def __init__(self, cfg: RunConfig) -> None:
        import torch

        from asyncrl.actors.policy.checkpoint import load_model
        from asyncrl.actors.roles.generate import DEFAULT_SLOTS
        from asyncrl.actors.tasks import RewardFunction, load_task

        # One thread: on a busy machine two threads of this small model took 15x as long.
        torch.set_num_threads(1)
        self.cfg = cfg
        self.slots = DEFAULT_SLOTS
        self.model, self.codec = load_model(cfg.model.path)
        task = load_task(cfg.data.task)
        self.reward = RewardFunction.load(cfg.data.reward, task, cfg.data.task)
        self.samples = [task.sample("validation", i) for i in range(cfg.data.val_prompts)]
        self.base = self.score(None)

    def score(self, weights: Path | None) -> float:
        from safetensors.torch import load_file

        from asyncrl.actors.policy.checkpoint import load_state
        from asyncrl.actors.policy.decoder import Decoder, Request
        from asyncrl.actors.tasks import TaskError

        if weights is not None:
            load_state(self.model, load_file(str(weights)))
        max_new = self.cfg.model.max_new_tokens
        decoder = Decoder(
            self.model,
            slots=self.slots,
            max_new_tokens=max_new,
            max_prompt_tokens=self.model.config.max_position_embeddings - max_new,
            eos_id=self.codec.eos_id,
            pad_id=self.codec.pad_id,
            seed=self.cfg.run.seed,
        )
        decoder.submit(
            Request(i, tuple(self.codec.encode(s.prompt)), greedy=True)
            for i, s in enumerate(self.samples)
        )
        total = 0.0
        while decoder.busy:
            for done in decoder.step():
                with contextlib.suppress(TaskError):  # 0, as the generator counts it
                    total += self.reward(self.samples[done.tag], self.codec.decode(done.tokens))
        return total / len(self.samples)


# ------------------------------------------------------------------------------- figures


@dataclass(frozen=True)
class Figures:
    to_target_s: float  # inf: not reached
    to_three_s: float
    train_s: float
    wall_s: float
    final_val: float
    step_s: float
    tail_reward: float


def figures(run: Run, target: float) -> Figures:
    steps = sorted(run.validation)
    above = [s for s in steps if run.validation[s] >= target]
    three = next(
        (
            s
            for i, s in enumerate(steps[2:], 2)
            if all(run.validation[x] >= target for x in steps[i - 2 : i + 1])
        ),
        None,
    )
    last = max(run.train_s)
    tail = [run.rewards[s] for s in sorted(run.rewards)[-TAIL_STEPS:]]
    return Figures(
        to_target_s=run.train_s[above[0]] if above else math.inf,
        to_three_s=run.train_s[three] if three is not None else math.inf,
        train_s=run.train_s[last],
        wall_s=run.wall_s,
        final_val=run.validation[steps[-1]],
        step_s=run.train_s[last] / last,
        tail_reward=sum(tail) / len(tail),
    )


def median_figures(runs: list[Figures]) -> Figures:
    """Each figure's median over the pairs; a target a run did not reach counts as infinitely
    late, so the median reaches it only if more than half the runs did."""
    names = [f.name for f in fields(Figures)]
    return Figures(**{n: statistics.median(getattr(r, n) for r in runs) for n in names})


# -------------------------------------------------------------------------------- report

_COLUMNS = (
    # (heading, figure, is a time: shown in seconds and as a ratio)
    ("to val>={target}", "to_target_s", True),
    ("to 3 in a row", "to_three_s", True),
    ("{steps} steps", "train_s", True),
    ("whole process", "wall_s", True),
    ("final val", "final_val", False),
    ("s/step", "step_s", True),
    ("train reward", "tail_reward", False),
)


def _cell(value: float, figure: str) -> str:
    if math.isinf(value):
        return "not reached"
    if figure == "step_s":
        return f"{value:.2f}"
    return f"{value:.0f} s" if figure.endswith("_s") else f"{value:.3f}"


# Each row: how many times longer the first took than the second.
RATIOS = (("TRL", "asyncrl"), ("TRL", "asyncrl sync"), ("asyncrl sync", "asyncrl"))


def _ratio(slower: float, faster: float) -> str:
    if math.isinf(slower) or math.isinf(faster):
        return "-"
    return f"{slower / faster:.2f}x"


def report(steps: int, target: float, medians: dict[str, Figures]) -> None:
    headings = [h.format(target=target, steps=steps) for h, _, _ in _COLUMNS]
    widths = [max(len(h), 11) + 2 for h in headings]

    def row(label: str, cells: list[str]) -> None:
        print(f"{label:<26}" + "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)))

    row("", headings)
    for name, fig in medians.items():
        row(name, [_cell(getattr(fig, f), f) for _, f, _ in _COLUMNS])
    for first, second in RATIOS:
        if first in medians and second in medians:
            a, b = medians[first], medians[second]
            row(
                f"{first} / {second}",
                [_ratio(getattr(a, f), getattr(b, f)) if t else "" for _, f, t in _COLUMNS],
            )
    print(flush=True)


# ---------------------------------------------------------------------------------- main


def bench_variant(
    variant: str, contenders: list[Contender], args: argparse.Namespace
) -> dict[str, Figures]:
    cfg_path = VARIANTS.get(variant) or Path(variant)
    # An engine this checkout's config refuses stops the bench here, before any run.
    cfg = load_config(cfg_path, [*args.overrides, f"backends.generate={args.engine}"])
    steps = args.steps or cfg.run.total_steps
    every = cfg.data.val_every_versions or 10
    evaluator = Evaluator(cfg)
    print(
        f"== {variant}: {steps} steps, {args.pairs} pair(s); validation of the base model "
        f"{evaluator.base:.3f} ({cfg.data.val_prompts} prompts, greedy)",
        file=sys.stderr,
        flush=True,
    )
    results: dict[str, list[Figures]] = {c.name: [] for c in contenders}
    for pair in range(args.pairs):
        for c in contenders if pair % 2 == 0 else contenders[::-1]:
            overrides = [*args.overrides, *c.overrides]
            if not c.trl:
                overrides.append(f"backends.generate={args.engine}")
            load = os.getloadavg()[0]  # anything else running skews this run
            with tempfile.TemporaryDirectory(prefix="asyncrl-vs-trl-") as tmp:
                work = Path(tmp)
                if c.trl:
                    run = run_trl(cfg_path, overrides, steps, every, work, args.trl_threads)
                else:
                    run = run_asyncrl(cfg_path, overrides, steps, every, work, c.name)
                started = time.monotonic()
                run.validation = {s: evaluator.score(p) for s, p in sorted(run.snapshots.items())}
                scored = time.monotonic() - started
            fig = figures(run, args.target)
            results[c.name].append(fig)
            print(
                f"   pair {pair + 1} {c.name}: {fig.train_s:.0f} s training, "
                f"{fig.wall_s:.0f} s whole, final val {fig.final_val:.3f}, "
                f"first val>={args.target} at {_cell(fig.to_target_s, 'to_target_s')} "
                f"({len(run.validation)} snapshots scored in {scored:.0f} s; "
                f"load average {load:.1f} before the run)",
                file=sys.stderr,
                flush=True,
            )
            if args.record is not None:
                with args.record.open("a") as out:
                    about = {"contender": c.name, "variant": variant, "pair": pair + 1}
                    extra = {"figures": asdict(fig), "load_before": load}
                    out.write(json.dumps(run.record(**about) | extra) + "\n")
    print(
        f"{variant}: {steps} steps, medians over {args.pairs} pair(s); asyncrl generating "
        f"with backends.generate={args.engine}"
    )
    medians = {name: median_figures(runs) for name, runs in results.items()}
    report(steps, args.target, medians)
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variant", default="both", help="default, long_tail, both, or a config file's path"
    )
    parser.add_argument("--pairs", type=int, default=2, help="rounds of every contender")
    parser.add_argument("--steps", type=int, default=0, help="0: the config's run.total_steps")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--without-trl", action="store_true", help="only the asyncrl contenders")
    parser.add_argument("--trl-threads", type=int, default=0, help="TRL's torch threads; 0: all")
    parser.add_argument("--record", type=Path, help="append each run's figures to this file")
    parser.add_argument(
        "--engine", default="torch", help="backends.generate of the asyncrl contenders"
    )
    parser.add_argument("overrides", nargs="*", help="section.key=value, for every contender")
    args = parser.parse_args(argv)
    with_trl = not args.without_trl and importlib.util.find_spec("trl") is not None
    if not with_trl and not args.without_trl:
        print(f"{INSTALL_HINT}; running the asyncrl contenders only", file=sys.stderr)
    contenders = [c for c in CONTENDERS if with_trl or not c.trl]
    if args.variant not in (*VARIANTS, "both") and not Path(args.variant).is_file():
        parser.error(f"--variant {args.variant}: expected default, long_tail, both or a file")
    for variant in VARIANTS if args.variant == "both" else [args.variant]:
        bench_variant(variant, contenders, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
