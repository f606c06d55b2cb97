"""The console scripts as a user runs them: real processes, exit codes, what they print."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.scheduler.core import CoreSettings
from asyncrl.runtime.scheduler.durable import JournaledCore

from ..support.pipeline_driver import Sim

BIN = Path(sys.executable).parent


def run(script: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / script), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("text", "overrides", "names"),
    [
        ("pipeline:\n  max_staleness: -1\n", [], ["pipeline.max_staleness", "-1"]),
        ("pipline: {}\n", [], ["pipline", "pipeline"]),
        ("algorithm:\n  estimator: ppo\n", [], ["algorithm.estimator", "ppo"]),
        ("run: [1, 2\n", [], ["line"]),
        ("", ["scheduler.control_port=abc"], ["scheduler.control_port", "abc"]),
        ("", ["pipeline.workers.genrate=2"], ["pipeline.workers.genrate", "generate"]),
    ],
)
def test_a_bad_config_is_one_line_naming_the_key(
    tmp_path: Path, text: str, overrides: list[str], names: list[str]
) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(text)
    result = run("asyncrl", "config", "check", "-c", config, *overrides)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("asyncrl: error: ")
    for name in names:
        assert name in lines[0]


def test_the_shipped_default_config_checks() -> None:
    default = Path(__file__).parents[2] / "deploy" / "configs" / "default.yaml"
    result = run("asyncrl", "config", "check", "-c", default, "pipeline.max_staleness=0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")
    shown = run("asyncrl", "config", "show", "pipeline.max_staleness=0")
    assert "max_staleness: 0" in shown.stdout


def test_inspect_replays_a_run_directory(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path)
    settings = CoreSettings(max_staleness=1, train_batch_groups=4)
    durable = JournaledCore.open(run_dir.journal, settings, resume=False, now=0.0)
    sim = Sim(durable.core, durable.commit, groups=200)
    sim.run()
    durable.close()
    # The simulated pipeline has a ref_logp worker: its stage runs only under a KL penalty.
    run_dir.config.write_text("pipeline:\n  train_batch_groups: 4\nalgorithm:\n  kl_coef: 0.01\n")
    result = run("asyncrl", "inspect", tmp_path, "--journal", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["steps_done"] == durable.core.state.steps_done
    assert summary["groups"]["trained"] == 4 * summary["steps_done"]
    assert summary["journal"]["records"] == durable.writer.last_seq


def test_inspect_of_a_missing_run_says_what_is_wrong(tmp_path: Path) -> None:
    result = run("asyncrl", "inspect", tmp_path / "nope", "--journal")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert "does not exist" in result.stderr


def test_the_schedulers_inspect_names_the_one_inspect(tmp_path: Path) -> None:
    result = run("asyncrl-scheduler", "inspect", tmp_path, "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert "asyncrl inspect RUN_DIR --journal" in result.stderr


def test_worker_roles_lists_the_table() -> None:
    result = run("asyncrl-worker", "roles")
    assert result.returncode == 0
    assert "generate: pending → generating → generated [admit]" in result.stdout
