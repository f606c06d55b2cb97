"""``asyncrl run`` with an agent harness (``data.harness``): real processes, the embedded
model, the official openai client. The harness role holds the generate stage; the
generator serves the harness's calls over HTTP and keeps following weight versions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import default_run
from tests.support.cluster import processes_mentioning, wait_for
from tests.support.default_run import records, steps

pytestmark = pytest.mark.timeout(240)

STEPS = 3


def run(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run",
        "-c", "deploy/configs/default.yaml", f"run.dir={run_dir}",
        "scheduler.control_port=0", "scheduler.events_port=0",
        f"run.total_steps={STEPS}", *overrides,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=200), run_dir


@pytest.mark.heavy  # 18-28 s: with the heavy tests, which CI runs
def test_the_arithmetic_task_trains_through_a_harness_asking_once(tmp_path: Path) -> None:
    done, run_dir = run(
        tmp_path,
        "data.harness=tests.support.harnesses:ask_once",
        "data.val_every_versions=2",
        "data.val_prompts=8",
        "pipeline.workers.generate=2",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = steps(run_dir)
    assert [s["step"] for s in lines] == list(range(1, STEPS + 1))
    keys = [key for s in lines for key in s["keys"]]
    assert len(keys) == len(set(keys)) == STEPS * 8
    # The harness's rewards were kept: the embedded model gets about half the sums right.
    assert all(0 < s["reward_mean"] < 1 for s in lines)
    assert all(0 <= s["staleness_max"] <= 2 for s in lines)
    # The generator's log-probs of a version are logp's own (proximal reuse held).
    assert all(s["logprob_mismatch_mean"] < 1e-4 for s in lines if s["logprob_mismatch_tokens"])
    # The serving generators followed the versions.
    loads = [json.loads(x) for x in (run_dir / "weights.jsonl").read_text().splitlines()]
    assert {x["version"] for x in loads} >= {1, 2}
    # The harness worker validated through the API, greedily: the base model's greedy
    # answers to the first 8 validation sums, as the generator scores them without a
    # harness (2 of 8 right), and nothing of it was recorded to train on.
    validation = [json.loads(x) for x in (run_dir / "validation.jsonl").read_text().splitlines()]
    assert validation[0]["worker"] == "harness-0" and validation[0]["version"] == 0
    assert validation[0]["val_prompts"] == 8 and validation[0]["val_reward_errors"] == 0
    assert validation[0]["val_reward"] == base_model_greedy_reward(8)
    # The run's last version was validated as it ended, through generators that stayed
    # for it.
    assert validation[-1]["version"] == STEPS and validation[-1]["val_reward_errors"] == 0
    # Sessions went to both generators, and every session's records were collected.
    for generator in ("generate-0", "generate-1"):
        (stopped,) = records(run_dir, generator, "stopped serving")
        assert stopped["calls"] > 0 and stopped["sessions_dropped_uncollected"] == 0
    assert list((run_dir / "api-servers").iterdir()) == []  # withdrawn on the way out
    assert processes_mentioning(str(run_dir)) == []


def base_model_greedy_reward(prompts: int) -> float:
    """The embedded model's greedy validation reward, from the warm-up's own scorer."""
    from asyncrl.actors.policy.checkpoint import load_model
    from asyncrl.actors.tasks.arithmetic import task
    from tests.tools.warmup import validation_reward

    model, codec = load_model("embedded")
    return validation_reward(model, codec, task, prompts, max_new_tokens=80)


@pytest.mark.heavy  # 18 s: with the heavy tests, which CI runs
def test_calls_that_extend_each_other_train_as_the_tokens_they_sampled(tmp_path: Path) -> None:
    """Each session makes two calls, the second extending the first by its token ids and
    more: one sequence a trajectory, with untrained tokens between the calls. logp scores
    every group again (proximal_logp=recompute): on the same version its log-probs equal
    the generator's, token for token, only if the sequence is exactly what was sampled."""
    done, run_dir = run(
        tmp_path,
        "data.harness=tests.support.harnesses:asks_twice",
        "data.val_every_versions=0",
        "algorithm.proximal_logp=recompute",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = steps(run_dir)
    assert [s["step"] for s in lines] == list(range(1, STEPS + 1))
    compared = [s for s in lines if s["logprob_mismatch_tokens"]]
    assert compared and max(s["logprob_mismatch_mean"] for s in compared) < 1e-4


@pytest.mark.heavy  # one of the slowest default runs (15-30 s): with the heavy tests
def test_a_harness_that_raises_hangs_or_returns_text_fails_its_group_not_the_run(
    tmp_path: Path,
) -> None:
    done, run_dir = run(
        tmp_path,
        "data.harness=tests.support.harnesses:misbehaves",
        "data.harness_timeout_s=2",
        "data.val_every_versions=0",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [s["step"] for s in steps(run_dir)] == list(range(1, STEPS + 1))
    reasons = {r["reason"] for r in records(run_dir, "harness-0", "group failed")}
    name = "harness 'tests.support.harnesses:misbehaves'"
    # The seeded order of prompts puts each kind among the first groups every run needs.
    assert any(r.startswith(name) and "ValueError: planted failure on" in r for r in reasons)
    assert any("still running after 2 s (data.harness_timeout_s)" in r for r in reasons)
    assert any("returned 'yes' (str), not a finite number" in r for r in reasons)
    died = records(run_dir, "scheduler", "groups died")
    assert died and all(name in d["reason"] and "attempt 3 of 3" in d["reason"] for d in died)
    assert processes_mentioning(str(run_dir)) == []


@pytest.mark.parametrize(
    ("harness", "message"),
    [
        ("tests.support.harnesses:not_async", "not an async function"),
        ("tests.support.nowhere:run", "cannot import 'tests.support.nowhere'"),
        ("tests.support.harnesses", "expected an import path"),
    ],
)
def test_a_bad_harness_stops_the_run_before_anything_starts(
    tmp_path: Path, harness: str, message: str
) -> None:
    done, run_dir = run(tmp_path, f"data.harness={harness}")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"asyncrl: data.harness={harness!r}: ") and message in line
    assert not (run_dir / "journal").exists()


@pytest.mark.heavy  # 35 s of kill -9 and restarts: CI's stage of heavy tests
def test_a_generator_and_then_the_harness_worker_killed_mid_run_lose_nothing(
    tmp_path: Path,
) -> None:
    """kill -9 of the serving generator, then of the harness worker: the groups in flight
    fail or go back with the reason, the killed processes come back, and the run ends with
    every step once and every group trained once."""
    run_dir, log = tmp_path / "run", tmp_path / "out.log"
    total = 10
    proc = default_run.start(
        run_dir,
        log,
        f"run.total_steps={total}",
        "data.harness=tests.support.harnesses:ask_once",
        "data.val_every_versions=0",
    )
    try:
        for name, after_step in (("generate-0", 1), ("harness-0", 4)):
            wait_for(lambda n=after_step: len(steps(run_dir)) >= n, 120, f"step {after_step}")
            os.kill(default_run.pid_of(log, name), signal.SIGKILL)
        assert proc.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = steps(run_dir)
    assert [s["step"] for s in lines] == list(range(1, total + 1))
    keys = [key for s in lines for key in s["keys"]]
    assert len(keys) == len(set(keys)) == total * 8
    restarted = log.read_text()
    assert "started generate-0 (pid" in restarted and "restart 1" in restarted
    assert processes_mentioning(str(run_dir)) == []
