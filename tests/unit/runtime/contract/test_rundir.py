"""Every path in a run directory comes from RunDir; the config moves the configurable ones."""

from __future__ import annotations

from pathlib import Path

from asyncrl.runtime.contract.config import load_config
from asyncrl.runtime.contract.rundir import RunDir


def test_the_key_directory_is_the_configured_one_with_the_run_dir_filled_in(
    tmp_path: Path,
) -> None:
    cfg = load_config(None, [f"run.dir={tmp_path}"])
    assert RunDir.of(cfg).keys == tmp_path / "keys"
    moved = load_config(None, [f"run.dir={tmp_path}", "scheduler.keys_dir='{run.dir}/../k'"])
    assert RunDir.of(moved).keys == tmp_path / ".." / "k"


def test_the_newest_checkpoint_is_the_highest_step(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.latest_checkpoint() is None
    for step in (9, 10, 2):
        run.checkpoint(step).mkdir(parents=True)
    assert run.latest_checkpoint() == run.checkpoint(10)


def test_weight_files_stay_in_the_run_and_slot_files_go_where_configured(tmp_path: Path) -> None:
    cfg = load_config(None, [f"run.dir={tmp_path}", f"weights.shm_dir={tmp_path / 'slots'}"])
    dirs = RunDir.of(cfg).weight_dirs(cfg.weights)
    assert dirs.files == tmp_path / "weights" and dirs.shared == tmp_path / "slots"
    default = load_config(None, [f"run.dir={tmp_path}"])
    shared = RunDir.of(default).weight_dirs(default.weights).shared
    assert shared != dirs.shared and "asyncrl" in shared.name  # /dev/shm, one per run
