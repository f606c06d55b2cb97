"""Where a real run's time goes: the step lines of ``asyncrl run``, read by ``asyncrl inspect``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.runtime.contract.bus import TimeBucket
from tests.integration.test_local_run import asyncrl_run
from tests.support.cluster import Cluster

pytestmark = pytest.mark.timeout(180)

TRAIN_S = 0.05  # the demo trainer's work per step


def inspect(*args: str | Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "inspect", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_a_runs_step_lines_account_for_each_roles_time_and_inspect_shows_it(
    tmp_path: Path,
) -> None:
    c = Cluster(tmp_path, run={"total_steps": 8})
    proc = asyncrl_run(c, work=f"generate=0.01,logp=0.01,train={TRAIN_S}")
    assert proc.wait(150) == 0, c.log_text("asyncrl-run")
    lines = c.metrics()
    assert [line["step"] for line in lines] == list(range(1, 9))

    for line in lines:
        for role, seen in line["roles"].items():
            if seen["reported_s"] == 0:
                continue
            total = sum(seen[b.key] for b in TimeBucket)
            assert total == pytest.approx(1.0, abs=0.002), (line["step"], role, seen)
    last = lines[-1]["roles"]
    assert {"generate", "logp", "ref_logp", "reward", "train"} <= set(last)
    assert last["train"]["compute"] > 0 and last["generate"]["scheduler"] > 0

    paths = [line["critical_path"] for line in lines]
    assert all(path["leased_to_trained_s"] >= TRAIN_S for path in paths)
    assert sum("ready_to_leased_s" in path for path in paths) >= 7
    reached = [entry for line in lines for entry in line.get("versions_loaded", ())]
    assert reached and all(entry["published_to_loaded_s"] >= 0 for entry in reached)

    table = inspect(c.run_dir)
    assert table.returncode == 0, table.stderr
    assert "8/8 steps done (journal)" in table.stdout
    for text in ("generate", "train", "compute", "waiting", "batch ready -> train lease"):
        assert text in table.stdout, table.stdout
    report = json.loads(inspect(c.run_dir, "--json").stdout)
    assert report["journal"]["steps_done"] == 8
    shares = report["roles"]["train"]
    assert sum(shares[b.key] for b in TimeBucket) == pytest.approx(1.0, abs=0.002)
    assert report["critical_path"]["median"]["leased_to_trained_s"] >= TRAIN_S

    config = c.run_dir / "config.yaml"  # changed after the run: its journal no longer replays
    config.write_text(config.read_text().replace("kl_coef: 0.01", "kl_coef: 0.0"))
    changed = inspect(c.run_dir)
    assert changed.returncode == 0 and "journal not replayed" in changed.stdout
    assert "batch ready -> train lease" in changed.stdout  # the step lines still show

    wrong = inspect(c.logs)  # a directory, but not a run's
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.count("\n") == 1 and "is not a run directory" in wrong.stderr
