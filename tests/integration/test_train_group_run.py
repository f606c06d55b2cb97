"""``asyncrl run`` with a training group of 2 ranks, one of them killed with SIGKILL.

The real RL pipeline (embedded model, arithmetic task), real processes. Killing rank 1
breaks the group: the supervisor kills rank 0 too and starts both again; they rejoin,
take up the state they staged after the last step counted, and the run ends with
every step trained once and no group trained twice.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

_STEPS, _BATCH = 14, 4


def _start(run_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run"]
    argv += ["-c", "deploy/configs/default.yaml", f"run.dir={run_dir}"]
    argv += [f"run.total_steps={_STEPS}", f"pipeline.train_batch_groups={_BATCH}"]
    argv += ["pipeline.workers.train=2", "pipeline.checkpoint_every=3"]
    argv += ["scheduler.control_port=0", "scheduler.events_port=0", "data.val_every_versions=0"]
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def _steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def _pid_of(log: Path, name: str) -> int:
    found = re.findall(rf"started {name} \(pid (\d+)", log.read_text())
    assert found, f"{name} never started:\n{log.read_text()}"
    return int(found[-1])


@pytest.mark.heavy  # 22 s of chaos: a rank killed mid-run
def test_a_rank_killed_mid_run_the_group_restarts_and_no_group_is_trained_twice(
    tmp_path: Path,
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    proc = _start(run_dir, log)
    try:
        deadline = time.monotonic() + 120
        while len(_steps(run_dir)) < 5:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no 5 steps within 120 s"
            time.sleep(0.01)
        # Step 5 just ended; training is this pipeline's slowest stage, so step 6 is most
        # likely under way now.
        time.sleep(0.2)
        os.kill(_pid_of(log, "train-1"), signal.SIGKILL)
        assert proc.wait(200) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()

    text = log.read_text()
    assert "train-0" in text and "of its gang failed" in text
    assert re.search(r"started train-1 \(pid \d+, restart 1\)", text), text
    steps = _steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, _STEPS + 1))
    keys = [key for s in steps for key in s["keys"]]
    assert len(keys) == len(set(keys)) == _STEPS * _BATCH  # no group trained twice
    assert all(s["train_ranks"] == 2 for s in steps)
    assert (run_dir / "final" / "model.safetensors").is_file()
    records = [json.loads(line) for line in (run_dir / "logs" / "scheduler.log").open()]
    registered = [r for r in records if r["event"] == "worker registered"]
    assert [r["worker"] for r in registered].count("train-0") == 2  # the group started anew


def test_versions_in_parts_are_relayed_and_a_scoring_group_takes_its_own_rows(
    tmp_path: Path,
) -> None:
    """Both groups of 2 ranks: the trainer publishes each version from both ranks (the
    default for FSDP2 groups), three generators relay its parts to one another over UCX
    (one receiver per node, nothing mapped), and logp's ranks each fetch the parts with
    their own rows. logp scores every group, and its log-probs agree with the
    generators': the rows went where they belong."""
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    steps = 20
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run"]
    argv += ["-c", "deploy/configs/default.yaml", f"run.dir={run_dir}"]
    argv += [f"run.total_steps={steps}", "data.val_every_versions=0"]
    argv += ["pipeline.workers.train=2", "pipeline.workers.logp=2"]
    argv += ["pipeline.workers.generate=3", "weights.relay_fanout=1"]
    argv += ["weights.map_on_host=false", "algorithm.proximal_logp=recompute"]
    argv += ["scheduler.control_port=0", "scheduler.events_port=0"]
    with log.open("wb") as out:
        assert (
            subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=240).returncode == 0
        ), log.read_text()[-3000:]
    done = _steps(run_dir)
    assert [s["step"] for s in done] == list(range(1, steps + 1))
    assert all(s["train_ranks"] == 2 for s in done)
    records = [json.loads(line) for line in (run_dir / "logs" / "scheduler.log").open()]
    announced = [r["manifest_keys"] for r in records if r["event"] == "weights announced"]
    assert announced and all("parts" in keys for keys in announced), announced
    loads = [json.loads(line) for line in (run_dir / "weights.jsonl").open()]
    relayed = [m for m in loads if m["source"].startswith("generate-")]
    assert relayed, "no version in parts came from a relay"
    assert any(m["worker"].startswith("generate-") for m in relayed), relayed
    # logp's group took published versions (how recent depends on the machine's pace).
    assert any(m["worker"] == "logp-0" and m["version"] >= 1 for m in loads), loads
    # Scored under rows in the wrong place, log-probs would be far off (units, not 1e-3).
    diffs = sorted(s["behaviour_proximal_abs_diff"] for s in done)
    assert diffs[len(diffs) // 2] < 1e-3, diffs
