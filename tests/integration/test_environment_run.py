"""``asyncrl run`` of the calculator config: multi-turn episodes in the generate role,
real processes. A flaky environment fails its groups with the reason; the run goes on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import processes_mentioning
from tests.support.default_run import records

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


def run_calculator(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "asyncrl.runtime.cli.main", "run",
        "-c", str(REPO / "deploy" / "configs" / "calculator.yaml"),
        f"run.dir={run_dir}", f"run.total_steps={STEPS}", "data.val_every_versions=0",
        "scheduler.control_port=0", "scheduler.events_port=0", *overrides,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=200, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def steps_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_calculator_config_trains_on_episodes_with_the_tool(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_calculator(run_dir)
    steps = steps_of(run_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # The base model calls the calculator and is right on about a third of the problems.
    assert 0 < sum(s["reward_mean"] for s in steps) / STEPS < 1
    # A trajectory holds the tool's answers too: longer than one model turn can be.
    assert max(s["response_len_max"] for s in steps) > 16
    assert processes_mentioning(str(run_dir)) == []


def test_an_environment_that_raises_fails_its_groups_and_the_run_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_calculator(run_dir, "data.environment=tests.support.flaky_env:BreaksOnSevens")
    assert [s["step"] for s in steps_of(run_dir)] == list(range(1, STEPS + 1))
    failed = records(run_dir, "generate-0", "group failed")
    assert failed, "no problem's answer ended in 7"
    assert all(
        "environment 'tests.support.flaky_env:BreaksOnSevens': step raised KeyError: 'no tool for"
        in r["reason"]
        for r in failed
    )
    assert processes_mentioning(str(run_dir)) == []
