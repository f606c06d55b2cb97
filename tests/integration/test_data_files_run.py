"""``asyncrl run`` on data files in verl's layout: the default config, two Parquet files
on the command line, real processes. The ground truths are written as fractions
(``\\frac{9424}{2}`` for 4712), so a response earns a reward only if the math verifier,
not a comparison of text, scored it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import processes_mentioning
from tests.support.datafiles import addition_rows, write_rows

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
STEPS = 3


def as_fractions(rows: list[dict]) -> list[dict]:
    for row in rows:
        truth = int(row["reward_model"]["ground_truth"])
        row["reward_model"]["ground_truth"] = f"\\frac{{{2 * truth}}}{{2}}"
    return rows


def test_the_default_run_trains_on_parquet_files_scored_by_the_verifier(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "T.parquet", as_fractions(addition_rows("train", 200)))
    val = write_rows(tmp_path / "V.parquet", as_fractions(addition_rows("validation", 16)))
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run",
        "-c", str(REPO / "deploy" / "configs" / "default.yaml"),
        f"data.train_files={train}", f"data.val_files={val}",
        f"run.dir={run_dir}", f"run.total_steps={STEPS}", "data.val_every_versions=2",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # The embedded model gets about 4 sums in 10 right; text equality with a fraction, none.
    assert sum(s["reward_mean"] for s in steps) > 0
    keys = [key for s in steps for key in s["keys"]]
    assert len(keys) == len(set(keys)) == STEPS * 8
    validation = [json.loads(x) for x in (run_dir / "validation.jsonl").read_text().splitlines()]
    assert validation[0]["version"] == 0 and validation[0]["val_prompts"] == 16
    assert validation[0]["val_reward"] > 0
    assert processes_mentioning(str(run_dir)) == []
