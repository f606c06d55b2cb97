"""A real short default run with ``run.dump_rollouts=true``: every group each step trained
is in the dump, every response of it, with the rewards the step's metrics show, and the
text of each line is what its token ids decode to. Then ``asyncrl report`` shows them."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.actors.policy.directories import model_dir
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.runtime.contract.config import load_config
from asyncrl.runtime.contract.rollout_dumps import read_rollouts
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.launch.report import write_report

# A whole run with every sample dumped: CI's slow stage.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


def test_a_run_dumps_every_sample_it_trained(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run", "-c",
            str(REPO / "deploy/configs/default.yaml"), f"run.dir={run_dir}",
            f"run.total_steps={STEPS}", "run.dump_rollouts=true",
            "scheduler.control_port=0", "scheduler.events_port=0"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = RunDir(run_dir)
    cfg = load_config(run.config)
    steps = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))

    dumps = read_rollouts(run.rollouts)
    assert dumps.skipped == dumps.superseded == 0 and dumps.filtered == []
    assert sorted(dumps.trained) == [s["step"] for s in steps]
    codec = TextCodec.from_dir(model_dir(cfg.model.path))
    for metrics in steps:
        lines = dumps.trained[metrics["step"]]
        # Every group the step consumed, every response of each.
        assert sorted({x["key"] for x in lines}) == sorted(metrics["keys"])
        assert len(lines) == len(metrics["keys"]) * cfg.data.group_size
        rewards = [x["reward"] for x in lines]
        assert statistics.fmean(rewards) == pytest.approx(metrics["reward_mean"], abs=1e-5)
        assert statistics.pstdev(rewards) == pytest.approx(metrics["reward_std"], abs=1e-5)
        truncated = statistics.fmean(x["truncated"] for x in lines)
        assert truncated == pytest.approx(metrics["truncated_frac"], abs=1e-6)
        for x in lines:
            assert x["prompt"] == codec.decode(x["prompt_ids"]) != ""
            assert x["response"] == codec.decode(x["response_ids"])
            assert x["reward_parts"] == {"task": x["reward"]}
            oldest, newest = x["versions"]
            assert 0 <= oldest <= newest <= metrics["step"] - 1
            assert x["advantage_per"] == "sequence"
        # GRPO's advantages are centred within each group.
        for key in metrics["keys"]:
            group = [x["advantage"] for x in lines if x["key"] == key]
            assert abs(sum(group)) < 1e-3 * len(group)

    page = write_report(run_dir).page.read_text()
    assert "<h2>Samples</h2>" in page
    assert f"{STEPS * len(steps[0]['keys']) * cfg.data.group_size} trained samples" in page
