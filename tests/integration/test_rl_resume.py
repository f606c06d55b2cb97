"""The RL roles as real processes under ``asyncrl run``: Ctrl-C, then ``--resume``.

A resumed run continues with the same counters (steps, versions, the trainer's
checkpoint) and the same data position (no prompt trained twice, none skipped).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.integration.test_local_run import asyncrl_run
from tests.support.cluster import Cluster, processes_mentioning, wait_for
from tests.support.models import tiny_model

pytestmark = pytest.mark.timeout(240)


def rl_cluster(tmp_path: Path) -> Cluster:
    return Cluster(
        tmp_path,
        run={"total_steps": 1000},
        data={"group_size": 4, "val_every_versions": 3, "val_prompts": 4},
        model={"path": str(tiny_model(tmp_path / "model")), "max_new_tokens": 12},
        algorithm={"lr": 1e-3},
        pipeline={"actors": "asyncrl.actors.roles", "checkpoint_every": 3},
    )


@pytest.mark.heavy  # one of the slowest default runs (15-30 s): with the heavy tests
def test_ctrl_c_then_resume_continues_counters_and_data_position(tmp_path: Path) -> None:
    c = rl_cluster(tmp_path)
    try:
        ctrl_c_then_resume(c)
    finally:  # a failed run must not go on loading the machine under the next tests
        for pid in processes_mentioning(str(c.config_path)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def ctrl_c_then_resume(c: Cluster) -> None:
    proc = asyncrl_run(c)
    wait_for(lambda: c.steps_done() >= 4, 150, "four train steps")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130, c.log_text("asyncrl-run")
    assert wait_for(lambda: not processes_mentioning(str(c.config_path)), 10, "no process left")
    done = c.steps_done()
    checkpoints = sorted((c.run_dir / "checkpoints").iterdir())
    counters = json.loads((checkpoints[-1] / "counters.json").read_text())
    assert counters["step"] == done  # the trainer checkpointed on its way out

    c.config["run"]["total_steps"] = done + 3
    c.config_path.write_text(yaml.safe_dump(c.config))
    again = asyncrl_run(c, "--resume")
    assert again.wait(150) == 0, c.log_text("asyncrl-run")

    lines = c.metrics()
    assert [line["step"] for line in lines] == list(range(1, done + 4))
    assert [line["policy_version"] for line in lines[done:]] == list(range(done, done + 3))
    trained = Counter(key for line in lines for key in line["keys"])
    assert max(trained.values()) == 1  # no prompt trained twice across the restart
    indices = sorted(int(key.split("-")[1]) for key in trained)
    batch = c.config["pipeline"]["train_batch_groups"]
    assert len(indices) == (done + 3) * batch
    assert indices[-1] < len(indices) + 4 * batch  # taken in order: at most a backlog skipped
    train_log = (c.run_dir / "logs" / "train-0.log").read_text()
    resumed = [json.loads(x) for x in train_log.splitlines() if "trainer state restored" in x]
    assert resumed and resumed[-1]["step"] == done
    assert (c.run_dir / "final" / "model.safetensors").exists()
