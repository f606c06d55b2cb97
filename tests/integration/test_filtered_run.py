"""Dynamic sampling in a real run: the embedded default with ``algorithm.filter_groups``.

A run whose reward leaves half the prompts without signal trains only groups with signal,
batches full, and counts the filtered ones in metrics.jsonl, the status and the report; a
run where no group ever carries signal stops on its own with the rule's reason, instead of
generating forever.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from asyncrl.runtime.contract.child_status import STOPS_THE_RUN
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.launch.report import write_report
from asyncrl.runtime.scheduler.replay import replay_journal
from tests.support.default_run import start, steps

pytestmark = pytest.mark.timeout(240)

STEPS = 4
FILTER = ("algorithm.filter_groups.enabled=true", "data.val_every_versions=0")


def _finish(proc: subprocess.Popen[bytes], log: Path, timeout: float) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        tail = log.read_text()[-3000:]
        raise AssertionError(f"the run did not end in {timeout:g} s:\n{tail}") from None


@pytest.mark.slow  # the default tier's longest run (about 30 s): CI's slow stage
def test_only_groups_with_signal_are_trained_and_the_filtered_are_counted(
    tmp_path: Path,
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    reward = "data.reward=tests.support.tasks:half_signal_reward"
    proc = start(run_dir, log, *FILTER, reward, f"run.total_steps={STEPS}")
    assert _finish(proc, log, 200) == 0, log.read_text()[-3000:]
    lines = steps(run_dir)
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    batch = 8  # pipeline.train_batch_groups of the default config
    for line in lines:
        assert len(line["keys"]) == batch, line  # the batch stayed full
        assert line["groups_no_spread"] == 0, line  # what the trainer received had signal
    last = lines[-1]
    assert last["groups_filtered"] > 0 and 0 < last["filtered_fraction"] < 1, last
    judged = last["groups_filtered"] + STEPS * batch
    assert last["prompts_per_batch"] == round(judged / STEPS, 3)
    fates = replay_journal(RunDir(run_dir))
    assert fates["groups"]["filtered"] == last["groups_filtered"]
    assert fates["groups"]["trained"] == STEPS * batch
    assert sum(fates["groups"].values()) == fates["created"]  # each group in one state
    page = write_report(run_dir).page.read_text()  # asyncrl report's page
    assert "groups filtered (no signal)" in page and "prompts per trained batch" in page


def test_a_run_where_nothing_carries_signal_stops_with_the_rule_named(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "run.log"
    reward = "data.reward=tests.support.tasks:constant_reward"
    bound = "algorithm.filter_groups.max_filtered_batches=1"
    began = time.monotonic()
    proc = start(run_dir, log, *FILTER, reward, bound, "run.total_steps=50")
    code = _finish(proc, log, 200)
    text = log.read_text()
    assert code == STOPS_THE_RUN, text[-3000:]
    assert "algorithm.filter_groups" in text and "the task gives no learning signal" in text
    assert "max_filtered_batches=1" in text
    assert steps(run_dir) == []  # not one step: nothing was worth training
    assert time.monotonic() - began < 200
