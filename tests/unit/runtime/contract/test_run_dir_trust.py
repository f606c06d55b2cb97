"""Files in a run directory that steer a process are trusted only as the run's own:
endpoints.json (where workers dial, and whether the bus is encrypted) and the entries of
api-servers/ (where harnesses send prompts, with a key). Another user's plants, files open
to others, links and malformed ones are refused with a line naming them; and an
endpoints.json can never turn CURVE off for a run that has keys."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from asyncrl.actors.serving.directory import ApiDirectory, ApiEntry
from asyncrl.runtime.contract.bus import Endpoints, announce_endpoints, read_endpoints
from asyncrl.runtime.contract.rundir import RunDir, UntrustedFile

NOBODY = 65534
LOOPBACK = "tcp://127.0.0.1:5555"


def plant(path: Path, text: str, mode: int = 0o600, uid: int | None = None) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, uid)


def endpoints_text(curve: bool, control: object = LOOPBACK) -> str:
    return json.dumps({"control": control, "events": "tcp://127.0.0.1:5556", "curve": curve})


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.make()
    return run


def test_an_endpoints_file_cannot_turn_curve_off_on_tcp(run: RunDir) -> None:
    plant(run.endpoints, endpoints_text(curve=False))
    assert read_endpoints(run).curve is True  # loopback TCP is open to every local user
    assert read_endpoints(run, "on").curve is True
    assert read_endpoints(run, "off").curve is False  # the config itself may say off
    far = endpoints_text(curve=False, control="tcp://192.0.2.7:5555")
    plant(run.endpoints, far)
    assert read_endpoints(run).curve is True
    plant(run.endpoints, endpoints_text(curve=False, control="ipc:///run/x/control"))
    assert read_endpoints(run).curve is False  # a private socket file


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ({"uid": NOBODY}, f"belongs to uid {NOBODY}"),
        ({"mode": 0o644}, r"open to other users \(mode 644"),
        ({"mode": 0o620}, "open to other users"),
    ],
    ids=["another-users", "world-readable", "group-writable"],
)
def test_an_endpoints_file_not_the_runs_own_is_refused(run: RunDir, how: dict, says: str) -> None:
    plant(run.endpoints, endpoints_text(curve=True), **how)
    with pytest.raises(UntrustedFile, match=says):
        read_endpoints(run)


def test_a_linked_or_malformed_endpoints_file_is_refused(run: RunDir, tmp_path: Path) -> None:
    plant(tmp_path / "elsewhere.json", endpoints_text(curve=False))
    run.endpoints.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(UntrustedFile, match="symbolic link"):
        read_endpoints(run)
    run.endpoints.unlink()
    for text, says in [
        ("{", "not JSON"),
        ("[1, 2]", "does not name"),
        (json.dumps({"control": LOOPBACK, "events": LOOPBACK}), "does not name"),
        (endpoints_text(True, control="http://evil:80"), "is not a bus endpoint"),
        (endpoints_text(True, control=5), "is not a bus endpoint"),
        (json.dumps({"control": LOOPBACK, "events": LOOPBACK, "curve": "no"}), "curve must"),
    ]:
        plant(run.endpoints, text)
        with pytest.raises(UntrustedFile, match=says):
            read_endpoints(run)


def test_what_the_scheduler_announces_is_private_and_read_back(run: RunDir) -> None:
    where = Endpoints(LOOPBACK, "tcp://127.0.0.1:5556", True, 4321)
    announce_endpoints(run, where)
    assert run.endpoints.stat().st_mode & 0o077 == 0
    assert read_endpoints(run) == where


def test_a_command_refuses_a_planted_endpoints_file_with_one_line(run: RunDir) -> None:
    plant(run.endpoints, endpoints_text(curve=False), uid=NOBODY)
    config = run.root / "run.yaml"
    config.write_text(f"run: {{dir: {run.root}}}\n")
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.runtime.scheduler.cli", "status", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "endpoints.json belongs to uid 65534" in line and "not trusted" in line


# --- api-servers/ ------------------------------------------------------------------------


def entry(worker: str, url: str = "http://127.0.0.1:1") -> ApiEntry:
    return ApiEntry(worker, url, "k3y", 0, os.getpid(), socket.gethostname())


def entry_text(value: ApiEntry) -> str:
    fields = ("worker", "url", "key", "version", "pid", "host")
    return json.dumps({name: getattr(value, name) for name in fields})


def test_api_entries_not_the_runs_own_are_refused_and_said_once(run: RunDir) -> None:
    directory = ApiDirectory(run.api_servers)
    directory.publish(entry("generate-0"))
    plant(run.api_servers / "generate-1.json", entry_text(entry("generate-1")), uid=NOBODY)
    plant(run.api_servers / "generate-2.json", entry_text(entry("generate-2")), mode=0o644)
    plant(run.api_servers / "generate-3.json", entry_text(entry("generate-4")))  # not its own
    plant(
        run.api_servers / "generate-5.json",
        entry_text(entry("generate-5", url="http://evil.example/steal?x=")),
    )
    with structlog.testing.capture_logs() as logs:
        assert [e.worker for e in directory.live()] == ["generate-0"]
        assert [e.worker for e in directory.live()] == ["generate-0"]
    reasons = [line["reason"] for line in logs if line["event"] == "API server entry refused"]
    assert len(reasons) == 4, reasons  # one line per file, not one per look
    assert any(f"uid {NOBODY}" in r for r in reasons)
    assert any("open to other users" in r for r in reasons)
    assert any("not the one its file is for" in r for r in reasons)
    assert any("is not http://HOST:PORT" in r for r in reasons)


def test_api_entries_in_a_directory_open_to_others_are_not_trusted(run: RunDir) -> None:
    directory = ApiDirectory(run.api_servers)
    directory.publish(entry("generate-0"))
    run.api_servers.chmod(0o777)
    with structlog.testing.capture_logs() as logs:
        assert directory.live() == []
    assert "no entry trusted" in logs[0]["reason"]
