"""``asyncrl run`` with a generative judge as the reward (``data.reward: judge:...``):
the reward role asks the policy itself, served by the generate role beside its leases,
through the official openai client. Real processes, the embedded model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import processes_mentioning
from tests.support.default_run import records, steps

pytestmark = pytest.mark.timeout(240)

STEPS = 3


@pytest.mark.heavy  # 13 s; with the heavy tests, to keep the default suite under its time
def test_a_generative_judge_scores_every_response_through_the_generators(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = [
        sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run",
        "-c", "deploy/configs/default.yaml", f"run.dir={run_dir}",
        "scheduler.control_port=0", "scheduler.events_port=0", f"run.total_steps={STEPS}",
        "data.reward=judge:tests.support.judges:agrees_with_greedy",
        "data.val_every_versions=2", "data.val_prompts=8",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = steps(run_dir)
    assert [s["step"] for s in lines] == list(range(1, STEPS + 1))
    # Sampled answers agree with the greedy one sometimes, not always.
    assert all(0 < s["reward_mean"] < 1 for s in lines)
    # One call per judged response, served in the generator's batch beside its leases.
    (stopped,) = records(run_dir, "generate-0", "stopped serving")
    assert stopped["calls"] >= STEPS * 8 * 8 and stopped["sessions_dropped_uncollected"] == 0
    # Validation scores with the task's own reward, not the judge: the ground truth.
    validation = [json.loads(x) for x in (run_dir / "validation.jsonl").read_text().splitlines()]
    assert validation[0]["worker"] == "generate-0" and validation[0]["val_reward"] == 0.25
    assert processes_mentioning(str(run_dir)) == []
