"""The embedded default run under ``asyncrl run``, as the fault tests drive it: start it
with overrides, read its step lines and its processes' JSON log records, find a child;
and any deploy config's run, waited for to its end."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The same run training adapters (model.lora) on two kinds of layer.
LORA = ("model.lora.rank=4", "model.lora.target_modules=[q_proj,down_proj]", "algorithm.lr=1e-3")


def start(run_dir: Path, log: Path, *overrides: str) -> subprocess.Popen[bytes]:
    """``asyncrl run`` of deploy/configs/default.yaml into ``run_dir``, output to ``log``."""
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run"]
    argv += ["-c", "deploy/configs/default.yaml", f"run.dir={run_dir}"]
    argv += ["scheduler.control_port=0", "scheduler.events_port=0", *overrides]
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


def run_config(
    config: str, run_dir: Path, steps: int, *overrides: str, timeout_s: float = 200
) -> subprocess.CompletedProcess[str]:
    """``asyncrl run`` of deploy/configs/``config`` into ``run_dir`` for ``steps`` steps,
    without validation unless an override asks for it; it must end with status 0."""
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run",
        "-c", str(REPO / "deploy" / "configs" / config),
        f"run.dir={run_dir}", f"run.total_steps={steps}", "data.val_every_versions=0",
        "scheduler.control_port=0", "scheduler.events_port=0", *overrides,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def start_ppo(
    run_dir: Path, log: Path, steps: int, batch: int, *overrides: str
) -> subprocess.Popen[bytes]:
    """The same run with a learned critic (PPO), ``steps`` steps of ``batch`` groups,
    without validation."""
    ppo = ["algorithm.estimator=gae", f"run.total_steps={steps}"]
    ppo += [f"pipeline.train_batch_groups={batch}", "data.val_every_versions=0"]
    return start(run_dir, log, *ppo, *overrides)


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Wait for ``asyncrl run`` to end with 0 (its output on failure); nothing of it is
    left running whatever happens."""
    try:
        assert proc.wait(timeout) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def steps(run_dir: Path) -> list[dict]:
    """The whole lines of ``metrics.jsonl`` so far."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def records(run_dir: Path, name: str, event: str) -> list[dict]:
    """Process ``name``'s log records of ``event``."""
    path = run_dir / "logs" / f"{name}.log"
    lines = path.read_text().splitlines() if path.is_file() else []
    found = [json.loads(line) for line in lines if line.startswith("{")]
    return [r for r in found if r.get("event") == event]


def pid_of(log: Path, name: str) -> int:
    """The pid of the newest start of child ``name``, from ``asyncrl run``'s output."""
    found = re.findall(rf"started {name} \(pid (\d+)", log.read_text())
    assert found, f"{name} never started:\n{log.read_text()}"
    return int(found[-1])
