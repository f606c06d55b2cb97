"""The generators' API entries: whole files, owner-only, gone when withdrawn or dead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from asyncrl.actors.serving.directory import ApiDirectory, ApiEntry
from asyncrl.transport.host import host_identity


def entry(worker: str, version: int = 0, pid: int | None = None) -> ApiEntry:
    pid = os.getpid() if pid is None else pid
    return ApiEntry(worker, "http://127.0.0.1:1", "k3y", version, pid, host_identity())


def test_an_entry_is_written_whole_owner_only_and_replaced_by_the_next(tmp_path: Path) -> None:
    directory = ApiDirectory(tmp_path / "api-servers")
    directory.publish(entry("generate-0", version=1))
    directory.publish(entry("generate-0", version=2))  # after loading a version
    assert directory.live() == [entry("generate-0", version=2)]
    assert (tmp_path / "api-servers").stat().st_mode & 0o077 == 0
    (file,) = (tmp_path / "api-servers").iterdir()  # no partial file left beside it
    assert file.name == "generate-0.json" and file.stat().st_mode & 0o077 == 0
    directory.withdraw("generate-0")
    directory.withdraw("generate-0")  # twice is fine
    assert directory.live() == []


def test_an_entry_of_a_dead_process_on_this_host_is_skipped(tmp_path: Path) -> None:
    directory = ApiDirectory(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    directory.publish(entry("generate-0", pid=int(gone.stdout)))
    directory.publish(entry("generate-1"))
    elsewhere = ApiEntry("generate-2", "http://10.0.0.2:1", "k", 0, 1, "another-host")
    directory.publish(elsewhere)  # found out only when its connection fails
    # Another container of this host name and boot id: its pid is not one of ours.
    beside = ApiEntry("generate-3", "http://10.0.0.3:1", "k", 0, int(gone.stdout),
                      f"{host_identity()}-another-container")  # fmt: skip
    directory.publish(beside)
    (tmp_path / "notes.json").write_text("not an entry")
    (tmp_path / "torn.json").write_bytes(b'{"worker": "\xb4"}')  # not even UTF-8
    assert [e.worker for e in directory.live()] == ["generate-1", "generate-2", "generate-3"]
    assert entry("x").session_url("s1") == "http://127.0.0.1:1/sessions/s1/v1"
