"""A run directory is its user's only, whatever the umask: the journal holds prompts and
outputs, the logs and checkpoints what the model made of them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from asyncrl.actors.policy.checkpoint import write_directory
from tests.support.umask import umask

BIN = Path(sys.executable).parent


def open_to_others(root: Path) -> list[str]:
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if not path.is_symlink() and mode & 0o077:
            found.append(f"{path.relative_to(root.parent)} {mode:o}")
    return found


def test_a_runs_files_are_private_under_a_permissive_umask(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        f"run: {{dir: {tmp_path / 'run'}, total_steps: 2}}\n"
        "pipeline: {train_batch_groups: 2, actors: tests.support.demo_pipeline}\n"
        "algorithm: {kl_coef: 0.01}\n"  # the demo runs every stage, ref_logp included
        "scheduler: {heartbeat_interval_s: 0.5}\n"
    )
    with umask(0o022):
        done = subprocess.run(
            [str(BIN / "asyncrl"), "run", "-c", str(config)], capture_output=True, timeout=120
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    run = tmp_path / "run"
    assert (run / "journal").is_dir() and (run / "logs").is_dir()
    assert (run / "metrics.jsonl").is_file()
    assert open_to_others(run) == []


def test_a_checkpoint_is_private_under_a_permissive_umask(tmp_path: Path) -> None:
    def fill(directory: Path) -> None:
        (directory / "model.safetensors").write_bytes(b"weights")  # as a library writes
        (directory / "adapter").mkdir()
        (directory / "adapter" / "config.json").write_text("{}")

    with umask(0o022):
        write_directory(tmp_path / "step-0000001", fill)
    assert open_to_others(tmp_path / "step-0000001") == []


def test_a_checkpoint_is_never_made_wider_than_it_was_written(tmp_path: Path) -> None:
    def fill(directory: Path) -> None:
        fd = os.open(directory / "model.safetensors", os.O_WRONLY | os.O_CREAT, 0o400)
        os.close(fd)

    with umask(0o077):
        write_directory(tmp_path / "final", fill)
    written = tmp_path / "final" / "model.safetensors"
    assert stat.S_IMODE(written.stat().st_mode) == 0o400
    assert stat.S_IMODE((tmp_path / "final").stat().st_mode) == 0o700
