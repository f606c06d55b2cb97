"""``asyncrl eval``: a checkpoint scored as the run validates its versions.

    asyncrl eval -c run.yaml --checkpoint DIR [--data FILE ...] [--samples K] [--out DIR]
                 [section.key=value ...]

DIR is any Hugging Face model directory: a run's ``final/``, one of its checkpoints, a
model of one's own, or a packaged model's name (``embedded``: the model before training).
The run's configuration says the rest, as it does for the validation of a run: the
validation sets (``data.val_files``, or the task's; ``--data`` instead),
``data.val_prompts`` per set, ``data.val_samples`` responses each (``--samples``),
``data.val_sampling``, the reward (``data.reward``, the task's or the verifier), the
engine (``backends.generate``) and its seed. With the same settings and weights it decodes
the same batches as the run's validation did on our decoder, so a greedy evaluation of a
version the run validated gives the same figures (vLLM's validation shares its batches
with training's requests: there, within a few prompts).

It runs in this process, on this machine: what it found wrong before loading anything (a
checkpoint, a data file, a plug-in, a key) is one line and exit status 2. A progress bar
counts the samples on the terminal. At the end it prints a table per data source and
writes, in ``--out`` (default ``run.dir/eval/NAME``, NAME the checkpoint directory's):
``eval.jsonl``, a line per evaluation (the report shows them beside the run's validation),
and ``samples.jsonl``, every sample of this one. Ctrl-C stops it leaving neither file
changed, and no process behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncrl.runtime.contract.commands import UsageError, add_config_arguments, config_from_args
from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir

from ..policy.directories import packaged_or_path
from ..startup.role_checks import check_device, check_engine, check_model, check_task
from ..tasks import TaskError
from ..tasks.rows import DataFileError
from .passes import ValidationPass
from .scores import table_text

__all__ = ["build_eval_parser", "eval_config", "evaluate"]

_BAR_WIDTH = 30


def build_eval_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncrl eval",
        description="score a checkpoint on the run's validation sets, as the run validates",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="a Hugging Face model directory (a run's final/, a checkpoint, a model) or a "
        "packaged model's name",
    )
    parser.add_argument(
        "--data",
        action="append",
        metavar="FILE",
        help="validation rows (JSONL or Parquet, verl's layout) instead of the run's; "
        "repeat for several",
    )
    parser.add_argument(
        "--samples", type=int, metavar="K", help="responses per prompt (data.val_samples)"
    )
    parser.add_argument(
        "--out", type=Path, help="where to write (default run.dir/eval/CHECKPOINT-NAME)"
    )
    add_config_arguments(parser)
    parser.set_defaults(handler=_eval)
    return parser


def eval_config(
    cfg: RunConfig, checkpoint: Path, data: list[str] | None, samples: int | None
) -> RunConfig:
    """The run's configuration with the checkpoint as its model, and ``--data`` and
    ``--samples`` in place of the validation files and ``data.val_samples``."""
    if cfg.data.harness:
        raise UsageError(
            "data.harness is set: a harness run validates through its harness; asyncrl eval "
            "decodes the task's prompts itself"
        )
    if cfg.model.lora.enabled:
        raise UsageError(
            "model.lora.rank is set: a LoRA run's checkpoints hold its adapters; evaluate a "
            "model directory with them merged, with model.lora.rank=0"
        )
    section = cfg.data
    changes: dict[str, Any] = {"val_every_versions": max(section.val_every_versions, 1)}
    if data:
        # The rows are scored as a run's data files are: data.reward, or the verifier.
        changes.update(val_files=list(data), train_files=section.train_files or list(data))
        changes.update(train_weights={} if not section.train_files else section.train_weights)
    if samples is not None:
        changes["val_samples"] = samples
    try:
        data_section = dataclasses.replace(section, **changes)
    except ValueError as error:  # its own words name the key, within data
        raise UsageError(f"data.{error}") from None
    model = dataclasses.replace(cfg.model, path=str(checkpoint))
    return dataclasses.replace(cfg, model=model, data=data_section)


def _eval(args: argparse.Namespace) -> int:
    # A packaged model's name too: the embedded default before its training, say.
    checkpoint = packaged_or_path(str(args.checkpoint))
    if not checkpoint.is_dir():
        raise UsageError(f"--checkpoint {args.checkpoint}: no such directory")
    if args.samples is not None and args.samples < 1:
        raise UsageError(f"--samples {args.samples}: expected an integer >= 1")
    checkpoint = checkpoint.resolve()
    cfg = eval_config(config_from_args(args), checkpoint, args.data, args.samples)
    problems = [
        *check_engine(cfg, "generate"),
        *check_device(cfg),
        *check_model(cfg),
        *check_task(cfg),
    ]
    if problems:
        raise UsageError("; ".join(problems))
    out = args.out or RunDir.of(cfg).evaluations / checkpoint.name
    _stop_on_signals()
    try:
        line, table = evaluate(cfg, checkpoint, out, progress=sys.stderr)
    except (DataFileError, TaskError) as error:
        raise UsageError(str(error)) from None
    except KeyboardInterrupt:
        print("asyncrl eval: interrupted; nothing written", file=sys.stderr)
        return 130
    print(table)
    print(f"wrote {out / 'eval.jsonl'} and {out / 'samples.jsonl'} ({line['seconds']:.1f} s)")
    return 0


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM stop the evaluation, once: even where the shell that started it
    ignores SIGINT (a background job), and without a second signal cutting its cleanup
    short."""

    def stop(_signum: int, _frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)


def evaluate(cfg: RunConfig, checkpoint: Path, out: Path, *, progress=None) -> tuple[dict, str]:
    """Evaluate ``checkpoint`` (``cfg.model.path``) and write ``out``'s files; the line
    added to ``eval.jsonl`` and the table. Ctrl-C leaves them as they were."""
    from ..startup.decoding import DEFAULT_SLOTS, Generation
    from ..startup.model_loading import load_policy, start_sglang, start_vllm
    from ..tasks.environment import load_environment, stop_ids
    from ..workload import load_workload, validation_reward_for
    from .sets import validation_sets

    started = time.monotonic()
    task = load_workload(cfg)  # a bad data file: before the engine's minutes of start-up
    reward = validation_reward_for(cfg, task)
    engine = model = None
    index = 0  # seeded as the run's validating generator (generate-0) is
    try:
        if cfg.backends.generate == "vllm":
            engine, codec, model_config = start_vllm(cfg, index)
        elif cfg.backends.generate == "sglang":
            engine, codec, model_config = start_sglang(cfg, index)
        else:
            model, codec = load_policy(cfg, "generate", index)
            model_config = model.config
        data = cfg.data
        environment = load_environment(data.environment) if data.environment else None
        stops = stop_ids(environment(), codec.encode) if environment else frozenset()
        generation = Generation(cfg, engine, codec, model_config, DEFAULT_SLOTS, index)
        version = checkpoint_version(checkpoint)
        decoder = generation.decoder(model, version=version or 0, validation=True)
        episodes = generation.episodes(decoder, environment=environment, stop_ids=stops)
        sets = validation_sets(task, data.val_prompts)
        validation = ValidationPass(
            version or 0,
            episodes,
            sets,
            samples=data.val_samples,
            greedy=data.val_sampling.greedy,
            reward=reward,
            encode=codec.encode,
            decode=codec.decode,
            threshold=data.val_pass_threshold,
            keep=True,
        )
        bar = _Progress(validation.left, progress)
        while not validation.done:
            bar.advance(len(validation.step()))
        bar.close()
        metrics = validation.metrics()
        kept = validation.kept or []
    finally:
        reward.close()
        if engine is not None:
            engine.close()
    line = {
        "checkpoint": str(checkpoint),
        "version": version,
        "time": round(time.time(), 3),
        "samples": cfg.data.val_samples,
        "engine": cfg.backends.generate,
        **metrics,
        "seconds": round(time.monotonic() - started, 3),
    }
    _write(out, line, [sample.to_dict() for sample in kept])
    return line, table_text(metrics)


def checkpoint_version(checkpoint: Path) -> int | None:
    """The policy version a run's directory holds: a checkpoint's counters, or the steps
    of the run whose ``final/`` it is; None for any other model directory."""
    for path, key in (
        (checkpoint / "counters.json", "policy_version"),
        (checkpoint.parent / "finished.json", "steps"),
    ):
        if path.name == "finished.json" and checkpoint.name != "final":
            continue
        try:
            value = json.loads(path.read_text(encoding="utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if type(value) is int:
            return value
    return None


def _write(out: Path, line: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    """The samples replace the last evaluation's at once (a rename); the line is added."""
    out.mkdir(parents=True, exist_ok=True)
    fd, staged = tempfile.mkstemp(prefix=".samples-", suffix=".jsonl", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for sample in samples:
                f.write(json.dumps(sample, ensure_ascii=False) + "\n")
        os.replace(staged, out / "samples.jsonl")
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise
    with open(out / "eval.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(line, separators=(",", ":")) + "\n")


class _Progress:
    """Samples scored of the pass: a bar redrawn in place on a terminal, a line per tenth
    elsewhere (a log keeps every line)."""

    def __init__(self, total: int, stream) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.tty = stream is not None and stream.isatty()
        self.started = time.monotonic()
        self._tenths = -1

    def advance(self, count: int) -> None:
        if self.stream is None or not count:
            return
        self.done += count
        tenths = 10 * self.done // self.total
        if not self.tty and tenths == self._tenths:
            return
        self._tenths = tenths
        filled = _BAR_WIDTH * self.done // self.total
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        text = f"[{bar}] {self.done}/{self.total} samples · {time.monotonic() - self.started:.0f}s"
        self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
