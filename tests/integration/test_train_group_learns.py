"""The default run with a training group of 2 ranks learns like one rank (slow: 5 min).

    python -m pytest -m slow tests/integration/test_train_group_learns.py

The embedded model, the arithmetic task, every default but ``pipeline.workers.train=2``:
validation reward starts about 0.44 and must reach 0.8, as the one-rank run does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_the_default_run_with_two_training_ranks_reaches_validation_reward_0_8(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run"]
    argv += ["-c", "deploy/configs/default.yaml", f"run.dir={run_dir}"]
    argv += ["pipeline.workers.train=2", "scheduler.control_port=0", "scheduler.events_port=0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1100)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert len(steps) == 300 and all(s["train_ranks"] == 2 for s in steps)
    validations = [json.loads(line) for line in (run_dir / "validation.jsonl").open()]
    assert validations[0]["val_reward"] < 0.6
    assert validations[-1]["val_reward"] >= 0.8, validations[-3:]
