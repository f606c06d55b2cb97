"""Directories replaced whole (runtime/contract/whole_dirs.py, as checkpoints and final/ are
written): a writer killed with SIGKILL in the middle of replacing one leaves the old
directory or the new one, whole, under its name; what it leaves beside it is removed by
the next writer, and only when its process is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl.actors.policy.checkpoint import write_directory
from asyncrl.runtime.contract.whole_dirs import leftovers, remove_leftovers, temporary_beside

pytestmark = pytest.mark.timeout(60)

OLD_FILES = 3000  # enough that deleting the old directory takes a while to watch

# The writer: replaces final/ with a directory of one file, saying when it has filled it.
WRITER = """
import sys
from pathlib import Path
from asyncrl.actors.policy.checkpoint import write_directory

def fill(staging):
    (staging / "new").write_text("new")
    print("filled", flush=True)

write_directory(Path(sys.argv[1]), fill)
print("done", flush=True)
"""


def _old_final(target: Path) -> None:
    target.mkdir(parents=True)
    for i in range(OLD_FILES):
        (target / f"old-{i}").write_text("old")


def _whole(target: Path) -> str:
    """ "old" or "new" if ``target`` is one of the two whole; else what it holds."""
    names = sorted(os.listdir(target))
    if names == ["new"] and (target / "new").read_text() == "new":
        return "new"
    if len(names) == OLD_FILES and all(n.startswith("old-") for n in names):
        return "old"
    return f"{len(names)} entries: {names[:3]}"


def test_a_writer_killed_while_it_replaces_final_leaves_the_old_or_the_new_whole(
    tmp_path: Path,
) -> None:
    target = tmp_path / "run" / "final"
    _old_final(target)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(target)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert writer.stdout is not None
    assert writer.stdout.readline() == "filled\n"
    # Watch final/ from here on, and kill the writer at the first sign of the replacing
    # step: the old directory's files going, or the new one's file there.
    while writer.poll() is None:
        names = os.listdir(target) if target.exists() else []
        if len(names) < OLD_FILES:
            break
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert _whole(target) in ("old", "new")
    # Whatever the killed writer left beside final/ goes with the next write there.
    left = [p for p in target.parent.iterdir() if p.name != "final"]
    assert [x.path for x in leftovers(target.parent)] == left
    write_directory(target, lambda staging: (staging / "new").write_text("new"))
    assert _whole(target) == "new" and os.listdir(target.parent) == ["final"]


def test_a_leftover_is_removed_only_once_its_process_is_gone(tmp_path: Path) -> None:
    target = tmp_path / "checkpoints" / "step-0000010"
    live = subprocess.Popen([sys.executable, "-c", _MAKE_TEMPORARY, str(target)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    dead = subprocess.run([sys.executable, "-c", _MAKE_TEMPORARY, str(target), "exit"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    try:
        assert live.stdout is not None
        live_dir, dead_dir = Path(live.stdout.readline().strip()), Path(dead.stdout.strip())
        assert live_dir.is_dir() and dead_dir.is_dir()
        mine = temporary_beside(target)  # this process's own: alive
        assert [x.path for x in leftovers(target.parent)] == [dead_dir]
        assert remove_leftovers(target.parent) == 1
        assert not dead_dir.exists() and live_dir.is_dir() and mine.is_dir()
    finally:
        live.kill()
        live.wait()
    deadline = time.monotonic() + 10
    while live_dir.exists() and time.monotonic() < deadline:  # its pid gone now
        remove_leftovers(target.parent)
    assert not live_dir.exists()


# Makes a temporary directory beside argv[1] and prints it; then waits unless told to exit.
_MAKE_TEMPORARY = """
import sys, time
from pathlib import Path
from asyncrl.actors.policy.checkpoint import write_directory
from asyncrl.runtime.contract.whole_dirs import temporary_beside

print(temporary_beside(Path(sys.argv[1])), flush=True)
if sys.argv[2:] != ["exit"]:
    time.sleep(60)
"""
