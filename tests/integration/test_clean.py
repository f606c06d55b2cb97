"""``asyncrl clean``: what a process killed with -9 left (a payload store, a weight slot
file, staged learner state in shared memory of the test's own, a checkpoint writer's
temporary directory) is listed, then removed; what a live process holds is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.actors.training.state_slot import SlotFile
from asyncrl.runtime.contract.whole_dirs import temporary_beside
from asyncrl.runtime.launch.cli.main import main
from asyncrl.transport.dataplane.store import PayloadStore

pytestmark = pytest.mark.timeout(60)

RUN_KEY = "0123456789ab"  # the digest part of a run's shared-memory directories

# Leaves one of each thing a run keeps, as ``rank`` of a trainer, then waits to be killed.
LEAVER = """
import os, sys, time
from pathlib import Path
from asyncrl.actors.training.state_slot import SlotFile
from asyncrl.runtime.contract.whole_dirs import temporary_beside
from asyncrl.transport.dataplane.store import PayloadStore

shm, run, rank, key = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
store = PayloadStore("generate-0", shared_dir=shm)
store.put({"ids": list(range(1000))})
staged = SlotFile(shm / f"asyncrl-{os.getuid()}-{key}-trainer" / f"rank{rank}-a.state")
(shm / f"asyncrl-{os.getuid()}-{key}" / f"{os.getpid()}-0.weights").write_bytes(b"w" * 4096)
print(store.directory, temporary_beside(run / "checkpoints" / "step-0000010"), flush=True)
time.sleep(60)
"""


def _things(shm: Path, run: Path) -> set[str]:
    found = {str(p.relative_to(shm)) for p in shm.rglob("*") if not p.is_dir()}
    found |= {str(p.relative_to(run)) for p in (run / "checkpoints").iterdir()}
    return {name.split("/")[0] if "payloads" in name else name for name in found}


def test_clean_removes_what_a_killed_process_left_and_keeps_a_live_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shm, run = tmp_path / "shm", tmp_path / "run"
    for name in (f"asyncrl-{os.getuid()}-{RUN_KEY}", f"asyncrl-{os.getuid()}-{RUN_KEY}-trainer"):
        (shm / name).mkdir(parents=True, mode=0o700)
    # This process's own, alive: each kind once.
    store = PayloadStore("logp-0", shared_dir=shm)
    store.put({"ids": [1, 2]})
    held = SlotFile(shm / f"asyncrl-{os.getuid()}-{RUN_KEY}-trainer" / "rank0-a.state")
    mine = shm / f"asyncrl-{os.getuid()}-{RUN_KEY}" / f"{os.getpid()}-0.weights"
    mine.write_bytes(b"w" * 4096)
    writing = temporary_beside(run / "checkpoints" / "step-0000020")
    before = _things(shm, run)
    # A process killed with -9 after making one of each.
    leaver = subprocess.Popen([sys.executable, "-c", LEAVER, str(shm), str(run), "1", RUN_KEY],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert leaver.stdout is not None
    left_store, left_temporary = (Path(p) for p in leaver.stdout.readline().split())
    leaver.send_signal(signal.SIGKILL)
    leaver.wait()
    left = _things(shm, run) - before
    assert (
        len(left) == 4
        and left_store.name in left
        and left_temporary.name in {Path(n).name for n in left}
    )

    try:
        assert main(["clean", "--shm", str(shm), str(run), "--dry-run"]) == 0
        listed = capsys.readouterr().out.splitlines()
        assert _things(shm, run) == before | left  # a dry run removes nothing
        assert sum(line.startswith("would remove ") for line in listed) == 4
        assert listed[-1].startswith("asyncrl clean: would remove 4 left by dead processes")
        assert "kept 3 in use" in listed[-1]  # a live writer's temporary is not listed

        assert main(["clean", "--shm", str(shm), str(run)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert _things(shm, run) == before  # the live process's, every one
        assert sorted(line.split()[1] for line in out if line.startswith("removed ")) == sorted(
            line.split()[2] for line in listed if line.startswith("would remove ")
        )
        assert out[-1].startswith("asyncrl clean: removed 4 left by dead processes")
        assert held.step() is None and writing.is_dir()  # still usable
    finally:
        held.close()
        store.close()
