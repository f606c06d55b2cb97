"""An engine gap made on purpose, with and without the corrections, one run after another.

    python -m tests.bench.engine_gap [-c CONFIG] [--only NAME ...] [section.key=value ...]

The generator runs in bfloat16 (``model.generate_dtype``) while logp and the trainer stay
in float32: the generator's log-probs of its own tokens are then off from the trainer
side's at the same version, as a serving engine's kernels in bfloat16 are. Runs (each a
real ``asyncrl run``, on the config as given, by default deploy/configs/default.yaml):

- ``float32``: no gap (the reference);
- ``bfloat16``: the gap, the default corrections (each part's weight truncated at 5);
- ``bfloat16-reject``: the gap, sequences whose geometric-mean engine ratio leaves
  [0.999, 1.001] give no loss (sequence-level rejection);
- ``bfloat16-icepop``: the gap, tokens whose engine ratio leaves [0.8, 1.25] give no
  loss (IcePop's masking).

Each round runs every one with one ``run.seed`` (``--seeds 0 1 2``: three rounds).
Printed per run: the final validation and the mean of the last three, the steps' mean
and largest engine gap (``logprob_mismatch_*``), and the means over steps of what the
engine correction did (every ``engine_*`` field of the step lines); then each run's
last-three validation against the float32 run's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.bench.sync_vs_async import lines, run_once

CONFIG = Path("deploy/configs/default.yaml")
GAP = ["model.generate_dtype=bfloat16", "algorithm.proximal_logp=recompute"]
RUNS: dict[str, list[str]] = {
    "float32": ["algorithm.proximal_logp=recompute"],
    "bfloat16": GAP,
    "bfloat16-reject": [
        *GAP,
        "algorithm.correction.engine.reject=geometric",
        "algorithm.correction.engine.low=0.999",
        "algorithm.correction.engine.high=1.001",
    ],
    "bfloat16-icepop": [
        *GAP,
        "algorithm.correction.engine.reject=token",
        "algorithm.correction.engine.low=0.8",
        "algorithm.correction.engine.high=1.25",
    ],
}
SAME_VALIDATION = 0.05  # what "learns to the same validation" allows


def _mean(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, int | float)]
    return sum(numbers) / len(numbers) if numbers else None


def summary(run_dir: Path) -> dict[str, float | None]:
    """The figures printed for one run directory."""
    steps = lines(run_dir / "metrics.jsonl")
    validation = [v["val_reward"] for v in lines(run_dir / "validation.jsonl")]
    figures: dict[str, float | None] = {
        "final_val": validation[-1] if validation else None,
        "last3_val": _mean(validation[-3:]),
        "gap_mean": _mean([s.get("logprob_mismatch_mean") for s in steps]),
        "gap_max": max((s.get("logprob_mismatch_max", 0.0) for s in steps), default=None),
        "gap_kl": _mean([s.get("logprob_mismatch_kl") for s in steps]),
        "gap_log_ppl": _mean([s.get("logprob_mismatch_log_ppl") for s in steps]),
    }
    engine = sorted({k for s in steps for k in s if k.startswith("engine_")})
    for key in engine:
        figures[key] = _mean([s.get(key) for s in steps])
    return figures


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", type=Path, default=CONFIG)
    parser.add_argument("--only", action="append", choices=sorted(RUNS), help="repeatable")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="run.seed of each round (default 0)"
    )
    parser.add_argument("overrides", nargs="*", help="section.key=value, for every run")
    args = parser.parse_args(argv)
    names = args.only or list(RUNS)
    last3: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="asyncrl-engine-gap-") as tmp:
        for seed in args.seeds:  # a round of every run per seed: drift spreads evenly
            for name in names:
                label = f"{name}-seed{seed}"
                overrides = [*args.overrides, *RUNS[name], f"run.seed={seed}"]
                outcome = run_once(label, args.config, overrides, Path(tmp), 2.0)
                figures = summary(Path(tmp) / label)
                if figures["last3_val"] is not None:
                    last3[name].append(figures["last3_val"])
                shown = ", ".join(f"{k} {_fmt(v)}" for k, v in figures.items())
                print(f"{label}: {outcome.steps} steps in {outcome.wall_s:.0f} s; {shown}")
    print("\nlast-3 validation per run, mean (min-max) over seeds", args.seeds)
    for name, values in last3.items():
        if values:
            print(f"{name}: {_mean(values):.3f} ({min(values):.3f}-{max(values):.3f})")
    reference = _mean(last3.get("float32", []))
    if reference is not None:
        for name, values in last3.items():
            if name == "float32" or not values:
                continue
            apart = abs(_mean(values) - reference)
            within = "within" if apart <= SAME_VALIDATION else "NOT within"
            print(f"{name}: {apart:.3f} from float32's, {within} {SAME_VALIDATION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
