"""``asyncrl run`` (embedded model, real processes) where the trainer's host is "lost": the
trainer is killed with SIGKILL and its staged state wiped from shared memory before it
comes back, so only the last checkpoint survives. The run rolls back to it exactly and
finishes on its own: the lost steps' lines leave ``metrics.jsonl`` and are trained again,
the groups they trained come back with their prompts (keys ``...#rollback1``), and no
step count goes on without the state that goes with it. The rollout dumps, read back,
hold each step's final groups, the first training of the lost steps superseded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl.runtime.contract.rollout_dumps import read_rollouts
from asyncrl.runtime.contract.rundir import RunDir
from tests.support import default_run

pytestmark = pytest.mark.timeout(300)

_STEPS, _BATCH, _EVERY = 8, 4, 2


# With LoRA the checkpoint is the adapters and their optimizer state, on the base.
@pytest.mark.heavy  # 25 s each: with the heavy tests, which CI runs
@pytest.mark.parametrize("more", [(), default_run.LORA], ids=["full", "lora"])
def test_a_trainer_whose_staged_state_is_lost_rolls_the_run_back_to_its_checkpoint(
    tmp_path: Path, more: tuple[str, ...]
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    proc = default_run.start(
        run_dir,
        log,
        f"run.total_steps={_STEPS}",
        f"pipeline.train_batch_groups={_BATCH}",
        f"pipeline.checkpoint_every={_EVERY}",
        "data.val_every_versions=0",
        "run.dump_rollouts=true",
        *more,
    )
    staged = RunDir(run_dir).staged_state
    try:
        deadline = time.monotonic() + 150
        while len(default_run.steps(run_dir)) < _EVERY + 1:  # past the checkpoint at step 2
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no 3 steps within 150 s"
            time.sleep(0.01)
        os.kill(default_run.pid_of(log, "train-0"), signal.SIGKILL)
        shutil.rmtree(staged)  # the host's memory went with it; the checkpoints did not
        assert proc.wait(200) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(staged, ignore_errors=True)

    restored = default_run.records(run_dir, "train-0", "trainer state restored")
    assert len(restored) == 2, restored
    again = restored[1]
    assert again["step"] in (2, 4, 6) and again["source"] != "staged", again
    rolled = default_run.records(run_dir, "scheduler", "training rolled back")
    assert [r["step"] for r in rolled] == [again["step"]], rolled
    lost_steps = rolled[0]["trained_again"] // _BATCH
    assert lost_steps >= 1

    # Every step once in the end, the lost ones trained again with their groups' prompts.
    steps = default_run.steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, _STEPS + 1))
    keys = [key for s in steps for key in s["keys"]]
    assert len(keys) == len(set(keys)) == _STEPS * _BATCH
    redone = [k for k in keys if k.endswith("#rollback1")]
    assert len(redone) == lost_steps * _BATCH, redone
    first = {k.removesuffix("#rollback1") for k in redone}
    assert not first & set(keys), "a group of a lost step kept its first training too"
    # The rollout dumps say the same: each step's lines are of the groups it trained in the
    # end; the lines the first trainer wrote of the lost steps are superseded.
    dumps = read_rollouts(RunDir(run_dir).rollouts)
    dumped = {step: sorted({x["key"] for x in lines}) for step, lines in dumps.trained.items()}
    assert dumped == {s["step"]: sorted(s["keys"]) for s in steps}
    group_size = len(dumps.trained[1]) // _BATCH
    assert dumps.superseded >= lost_steps * _BATCH * group_size, dumps.superseded
    assert dumps.skipped <= 1  # the line being written when the trainer was killed
    # Whatever ran on a lost version started afresh, saying why.
    afresh = [
        r
        for name in ("generate-0", "logp-0")
        for r in default_run.records(run_dir, name, "worker failed")
        if "rolled back" in r.get("error", "")
    ]
    for record in afresh:
        assert f"rolled back to version {again['step']}" in record["error"], record
    # Every group created is in one state: the groups the lost steps trained are counted
    # as superseded (asyncrl inspect --journal replays the journal to say so).
    inspect = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "inspect", str(run_dir),
               "--journal"]  # fmt: skip
    summary = json.loads(subprocess.run([*inspect, "--json"], capture_output=True, text=True,
                                        check=True).stdout)  # fmt: skip
    groups = summary["groups"]
    assert groups["superseded"] == rolled[0]["trained_again"], groups
    assert groups["trained"] == _STEPS * _BATCH, groups
    assert sum(groups.values()) == summary["created"], summary
