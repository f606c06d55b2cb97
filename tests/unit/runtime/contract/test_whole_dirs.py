"""Directories replaced whole (runtime/contract/whole_dirs.py), on a file system that cannot
exchange two names in one rename: the old one is parked, and put back if a crash left
nothing in its place."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from asyncrl.runtime.contract import whole_dirs
from asyncrl.runtime.contract.whole_dirs import (
    leftovers,
    remove_directory,
    replace_directory,
    restore_parked,
    temporary_beside,
)


def _gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _directory(path: Path, text: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "what").write_text(text)
    return path


def test_without_exchange_the_old_directory_is_parked_then_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _directory(tmp_path / "final", "old")
    monkeypatch.setattr(whole_dirs, "_exchange", lambda a, b: False)  # as on NFS
    replace_directory(_directory(temporary_beside(target), "new"), target)
    assert (target / "what").read_text() == "new" and os.listdir(tmp_path) == ["final"]


def test_a_directory_parked_by_a_writer_killed_before_the_new_one_went_in_is_put_back(
    tmp_path: Path,
) -> None:
    target = tmp_path / "final"
    tag = whole_dirs._host_tag()
    parked = _directory(tmp_path / f".final.tmp-{tag}-{_gone_pid()}-parked", "old")
    assert leftovers(tmp_path) == []  # the only copy of final/: never a leftover
    restore_parked(target)
    assert (target / "what").read_text() == "old" and not parked.exists()


def test_a_directory_removed_is_gone_from_its_name_at_once(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    _directory(checkpoints / "step-0000001", "one")
    remove_directory(checkpoints / "step-0000001")
    assert os.listdir(checkpoints) == []


def test_another_hosts_or_a_live_processs_temporary_is_no_leftover(tmp_path: Path) -> None:
    tag = whole_dirs._host_tag()
    dead = _directory(tmp_path / f".step-0000002.tmp-{tag}-{_gone_pid()}-x1", "")
    _directory(tmp_path / f".step-0000002.tmp-{tag}-{os.getpid()}-x2", "")  # this process
    _directory(tmp_path / f".step-0000002.tmp-00000000-{_gone_pid()}-x3", "")  # another host
    _directory(tmp_path / ".step-0000002-x4", "")  # not a temporary name of ours
    assert [x.path for x in leftovers(tmp_path)] == [dead]
