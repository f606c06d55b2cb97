"""``asyncrl run`` (embedded model, real processes) with its trainer killed by SIGKILL
after a step, no checkpoint to go back to: the restarted trainer takes up exactly the
step the scheduler counts, bit for bit the state its predecessor staged (the checksum
logged when it was staged), and no step is lost, none trained twice.

Alone and as a group of 2 ranks (either rank killed: the group restarts together and
every rank takes up the same step). With several updates per step and a learning-rate
schedule, the killed run ends with the very weights of a run that was not disturbed: the
rate and the mini-batches come from the step's number. Such runs are the same run to run
only with ``pipeline.max_staleness=0`` and one generator (which version generated which
group is then fixed), so that comparison uses them.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from asyncrl.runtime.contract.rundir import RunDir
from tests.support import default_run

pytestmark = pytest.mark.timeout(300)

_STEPS, _BATCH, _KILL_AFTER = 8, 4, 3


def _start(run_dir: Path, log: Path, ranks: int, *more: str) -> subprocess.Popen[bytes]:
    return default_run.start(
        run_dir,
        log,
        f"run.total_steps={_STEPS}",
        f"pipeline.train_batch_groups={_BATCH}",
        f"pipeline.workers.train={ranks}",
        "pipeline.checkpoint_every=1000",
        "data.val_every_versions=0",
        *more,
    )


_steps, _records, _pid_of = default_run.steps, default_run.records, default_run.pid_of


def _kill_after_a_step_and_finish(tmp_path: Path, ranks: int, victim: str, *more: str) -> Path:
    run_dir, log = tmp_path / "run", tmp_path / "asyncrl-run.log"
    proc = _start(run_dir, log, ranks, *more)
    try:
        deadline = time.monotonic() + 150
        while len(_steps(run_dir)) < _KILL_AFTER:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"no {_KILL_AFTER} steps within 150 s"
            time.sleep(0.01)
        os.kill(_pid_of(log, victim), signal.SIGKILL)
        assert proc.wait(200) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(RunDir(run_dir).staged_state, ignore_errors=True)
    return run_dir


def _run_undisturbed(tmp_path: Path, *more: str) -> Path:
    run_dir, log = tmp_path / "undisturbed", tmp_path / "undisturbed.log"
    proc = _start(run_dir, log, 1, *more)
    default_run.finish(proc, log, 200)
    return run_dir


def _check_no_step_lost(run_dir: Path, ranks: int) -> None:
    steps = _steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, _STEPS + 1))
    keys = [key for s in steps for key in s["keys"]]
    assert len(keys) == len(set(keys)) == _STEPS * _BATCH  # no group trained twice
    for rank in range(ranks):
        name = f"train-{rank}"
        staged = _records(run_dir, name, "state staged")
        restored = _records(run_dir, name, "trainer state restored")
        assert [r["step"] for r in restored][:1] == [0], name  # the first start: the base
        later = restored[1:]
        assert len(later) == 1, (name, restored)
        again = later[0]
        # Restored from memory, at the step the scheduler counted (at least the steps it
        # had when the kill came; a step staged but not yet counted is not taken)...
        assert again["source"] == "staged" and again["step"] >= _KILL_AFTER, again
        # ... bit for bit the state the killed trainer staged after that step ...
        before = [r for r in staged if r["step"] == again["step"]]
        assert before and before[0]["checksum"] == again["checksum"], (again, before)
        # ... and every step staged once in order, but a step staged and then lost with
        # its process before it counted, staged again.
        numbers = [r["step"] for r in staged]
        assert numbers[-1] == _STEPS
        assert all(b <= a + 1 for a, b in itertools.pairwise(numbers)), numbers
        assert sorted(set(numbers)) == list(range(1, _STEPS + 1)), numbers
    assert not RunDir(run_dir).staged_state.exists()  # the run ended: nothing left in RAM


@pytest.mark.heavy  # 16-25 s: with the heavy tests, which CI runs
def test_a_killed_trainer_resumes_at_the_scheduler_step_with_the_staged_state(
    tmp_path: Path,
) -> None:
    run_dir = _kill_after_a_step_and_finish(tmp_path, 1, "train-0")
    _check_no_step_lost(run_dir, 1)


@pytest.mark.heavy  # 25 s
def test_a_killed_lora_trainer_resumes_from_its_staged_adapters(tmp_path: Path) -> None:
    # The staged state is the adapters' and their optimizer's alone.
    run_dir = _kill_after_a_step_and_finish(tmp_path, 1, "train-0", *default_run.LORA)
    _check_no_step_lost(run_dir, 1)
    final = RunDir(run_dir).final_model
    assert (final / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["train-1", "train-0"])
def test_a_group_with_a_rank_killed_resumes_every_rank_at_the_same_staged_step(
    tmp_path: Path, victim: str
) -> None:
    run_dir = _kill_after_a_step_and_finish(tmp_path, 2, victim)
    _check_no_step_lost(run_dir, 2)
    assert all(s["train_ranks"] == 2 for s in _steps(run_dir))


_SCHEDULED_UPDATES = (
    "pipeline.max_staleness=0",  # one generator and on-policy: the same groups run to run
    "algorithm.mini_batches=2",
    "algorithm.epochs=2",
    "algorithm.lr_schedule.kind=cosine",
    "algorithm.lr_schedule.warmup_steps=2",
    "algorithm.lr_schedule.min_lr_ratio=0.1",
)


@pytest.mark.heavy  # two runs, 40-60 s
def test_a_killed_trainer_with_mini_batches_and_a_schedule_ends_as_an_undisturbed_run(
    tmp_path: Path,
) -> None:
    undisturbed = _run_undisturbed(tmp_path, *_SCHEDULED_UPDATES)
    run_dir = _kill_after_a_step_and_finish(tmp_path, 1, "train-0", *_SCHEDULED_UPDATES)
    _check_no_step_lost(run_dir, 1)
    killed_steps, calm_steps = _steps(run_dir), _steps(undisturbed)
    assert all(s["updates"] == 4 for s in killed_steps)  # 2 mini-batches x 2 epochs
    # the rate of every step, the restarted trainer's too, is the undisturbed run's
    assert [s["lr"] for s in killed_steps] == [s["lr"] for s in calm_steps]
    assert killed_steps[0]["lr"] == 1e-4 and killed_steps[1]["lr"] == 2e-4  # the warm-up
    assert [s["keys"] for s in killed_steps] == [s["keys"] for s in calm_steps]
    final, expected = (
        load_file(str(RunDir(d).final_model / "model.safetensors")) for d in (run_dir, undisturbed)
    )
    assert final.keys() == expected.keys()
    for name, weight in expected.items():
        torch.testing.assert_close(final[name], weight, rtol=0, atol=1e-6, msg=name)
