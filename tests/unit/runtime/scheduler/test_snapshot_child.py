"""Snapshots dumped by a forked child: the caller goes on, a failure costs nothing but
replay, a failed fork falls back to the caller's thread, and a child never outlives its
scheduler (nor keeps its journal locked)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
from structlog.testing import capture_logs

import asyncrl.runtime.scheduler.durable as durable_module
from asyncrl.runtime.scheduler.core import CoreSettings
from asyncrl.runtime.scheduler.core.codec import dump_state
from asyncrl.runtime.scheduler.durable import RETRY_AFTER_FAILURE_S, JournaledCore, recover
from asyncrl.runtime.scheduler.journal import JournalWriter, replay
from tests.support.pipeline_driver import Sim

SETTINGS = CoreSettings(max_staleness=1, train_batch_groups=4, max_attempts=3)
REPO = Path(__file__).resolve().parents[4]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="snapshots fork on POSIX")


def open_core(directory: Path, clock: list[float] | None = None) -> JournaledCore:
    now = clock if clock is not None else [0.0]
    return JournaledCore.open(
        directory,
        SETTINGS,
        resume=False,
        now=0.0,
        writer_factory=lambda path: JournalWriter.open(path, snapshot_every=50),
        clock=lambda: now[0],
        snapshot_in_child=True,
    )


def run_until_forked(durable: JournaledCore) -> Sim:
    sim = Sim(durable.core, durable.commit, groups=10_000)
    sim.start()
    while not durable.writer.snapshot_in_flight:
        sim.step()
    return sim


def test_the_child_dumps_the_state_of_the_fork_while_the_caller_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, go, dumped_by = tmp_path / "journal", tmp_path / "go", tmp_path / "pid"

    def dump_when_told(state):  # runs in the child: it waits for the test to let it go
        dumped_by.write_text(str(os.getpid()))
        deadline = time.monotonic() + 30
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return dump_state(state)

    monkeypatch.setattr(durable_module, "dump_state", dump_when_told)
    durable = open_core(journal)
    sim = run_until_forked(durable)
    forked_at = durable.writer.last_seq
    at_fork = dump_state(durable.core.state)
    # The child is held, yet the caller goes on committing: it never waited for the dump.
    for _ in range(20):
        sim.step()
    assert durable.writer.snapshot_in_flight and durable.writer.snapshots_written == 0
    assert durable.writer.last_seq > forked_at
    go.touch()
    live = dump_state(durable.core.state)
    durable.close()  # waits for the child, then puts its snapshot in place
    assert int(dumped_by.read_text()) != os.getpid()
    found = replay(journal)
    assert found.snapshot_seq == forked_at
    # The state as it was at the fork, not as it went on (as msgpack gives it back).
    assert found.snapshot == msgpack.unpackb(msgpack.packb(at_fork), strict_map_key=False)
    core, _ = recover(journal, SETTINGS)
    assert dump_state(core.state) == live
    assert not list(journal.glob("*.tmp"))


def test_a_failed_child_loses_nothing_says_why_and_is_not_retried_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(_state):
        raise RuntimeError("no space left for the snapshot")

    monkeypatch.setattr(durable_module, "dump_state", fail)
    journal, clock = tmp_path / "journal", [0.0]
    durable = open_core(journal, clock)
    sim = run_until_forked(durable)
    with capture_logs() as logs:
        while durable.writer.snapshot_in_flight:  # each commit looks whether it ended
            sim.step()
    (warning,) = [e for e in logs if e["event"].startswith("snapshot failed")]
    assert warning["reason"] == "RuntimeError: no space left for the snapshot"
    # Past the cap of records, still no new child until the retry time.
    for _ in range(600):
        sim.step()
        assert not durable.writer.snapshot_in_flight
    clock[0] += RETRY_AFTER_FAILURE_S
    sim.step()
    assert durable.writer.snapshot_in_flight
    monkeypatch.setattr(durable_module, "dump_state", dump_state)
    live = dump_state(durable.core.state)
    durable.close()
    assert not list(journal.glob("snapshot-*")), "both children failed: no snapshot"
    core, found = recover(journal, SETTINGS)
    assert found.snapshot is None and dump_state(core.state) == live


def test_a_fork_that_fails_takes_the_snapshot_on_the_callers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_fork() -> int:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(os, "fork", no_fork)
    durable = open_core(tmp_path / "journal")
    sim = Sim(durable.core, durable.commit, groups=10_000)
    sim.start()
    with capture_logs() as logs:
        while durable.writer.snapshots_written == 0:
            sim.step()
            assert not durable.writer.snapshot_in_flight
    assert any(e["event"].startswith("snapshot taken in the scheduler") for e in logs)
    durable.close()
    assert replay(tmp_path / "journal").snapshot is not None


# The scheduler, its child stuck in its dump: the test kills the scheduler.
_SCHEDULER = """
import os, sys, time
from pathlib import Path
import asyncrl.runtime.scheduler.durable as durable_module
from tests.unit.runtime.scheduler.test_snapshot_child import open_core, run_until_forked

def stuck(state):
    Path(sys.argv[2]).write_text(str(os.getpid()))
    time.sleep(600)

durable_module.dump_state = stuck
durable = open_core(Path(sys.argv[1]))
run_until_forked(durable)
print(durable.writer.last_seq, flush=True)
time.sleep(600)
"""


def test_a_child_dies_with_its_scheduler_and_the_journal_opens_again(tmp_path: Path) -> None:
    journal, child_pid = tmp_path / "journal", tmp_path / "child"
    scheduler = subprocess.Popen(
        [sys.executable, "-c", _SCHEDULER, str(journal), str(child_pid)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert scheduler.stdout is not None
        forked_at = int(scheduler.stdout.readline())
        deadline = time.monotonic() + 30
        while not child_pid.exists() or not child_pid.read_text():
            assert time.monotonic() < deadline, "the child never started its dump"
            time.sleep(0.01)
        child = int(child_pid.read_text())
    finally:
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait(30)
    deadline = time.monotonic() + 10
    while _alive(child):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the child outlived its scheduler")
        time.sleep(0.02)
    writer = JournalWriter.open(journal)  # not locked by an orphan
    writer.close()
    found = replay(journal)
    assert found.snapshot is None and len(found.records) >= forked_at  # every record kept


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its new parent to reap it."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def test_a_child_whose_status_another_wait_took_counts_as_failed(tmp_path: Path) -> None:
    durable = open_core(tmp_path / "journal")
    run_until_forked(durable)
    slot_child = durable.writer._in_child
    assert slot_child is not None
    os.waitpid(slot_child[1].pid, 0)  # as a wait for any child elsewhere would
    with capture_logs() as logs:
        durable.commit()
    assert not durable.writer.snapshot_in_flight
    (warning,) = [e for e in logs if e["event"].startswith("snapshot failed")]
    assert "another wait" in warning["reason"]
    durable.close()
    assert not list((tmp_path / "journal").glob("*.tmp"))


def test_without_fork_the_snapshot_is_taken_on_the_callers_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncrl.runtime.scheduler.journal._child as child_module

    monkeypatch.setattr(child_module, "FORK_AVAILABLE", False)
    durable = open_core(tmp_path / "journal")
    sim = Sim(durable.core, durable.commit, groups=10_000)
    sim.start()
    while durable.writer.snapshots_written == 0:
        sim.step()
        assert not durable.writer.snapshot_in_flight
    durable.close()
    assert replay(tmp_path / "journal").snapshot is not None
