"""A supervised worker that is alive but frozen (stopped, or inside one C call that holds
the GIL, so that none of its threads runs) is killed by its supervisor once its pulse has
been silent ``stall_after_s``, with a line saying why, and started again
(runtime/contract/pulse.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from asyncrl.runtime.contract.pulse import PULSE_S
from asyncrl.runtime.launch import ChildSpec, Supervisor
from asyncrl.runtime.launch.pulses import Pulses

pytestmark = pytest.mark.timeout(60)

_STALL_S = 2.0
# How late the kill may come after the freeze: the limit, a beat's interval, the
# supervisor's tick, and room for a machine busy with other work.
_BOUND_S = _STALL_S + PULSE_S + 5.0

# Beats, and on its first start freezes after a few beats: argv[2] "stop" stops itself,
# "gil" backtracks a regular expression in one C call, never letting go of the GIL. It
# writes when it froze (the system's monotonic clock, which every process shares).
WORKER = """
import os, pathlib, re, signal, sys, time
from asyncrl.runtime.contract.pulse import start_pulse
start_pulse()
log = pathlib.Path(sys.argv[1])
first = not log.exists()
with log.open("a") as f:
    f.write("start\\n")
if first:
    time.sleep(1.0)
    with log.open("a") as f:
        f.write(f"frozen {time.monotonic()}\\n")
    if sys.argv[2] == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        re.match(r"(a+)+b", "a" * 60)
time.sleep(60)
"""
# Never beats: not watched, however long it is quiet.
QUIET = "import time; time.sleep(60)"


@pytest.mark.parametrize("how", ["stop", "gil"])
def test_a_frozen_worker_is_killed_and_restarted_within_the_bound(tmp_path: Path, how: str) -> None:
    log = tmp_path / "worker.txt"
    specs = [
        ChildSpec("reward-0", [sys.executable, "-c", WORKER, str(log), how], restart=True),
        ChildSpec("quiet-0", [sys.executable, "-c", QUIET], restart=True),
    ]
    events: list[tuple[float, str, dict[str, object]]] = []
    supervisor = Supervisor(
        specs,
        tmp_path / "logs",
        backoff_initial_s=0.1,
        stall_after_s=_STALL_S,
        stop_grace_s=2.0,
        on_event=lambda kind, fields: events.append((time.monotonic(), kind, fields)),
    )

    def stop_once_the_restarted_one_lived_past_the_limit() -> None:
        deadline = time.monotonic() + 40
        while log_starts(log) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(_STALL_S * 2)  # beating: not killed again
        supervisor.request_stop()

    threading.Thread(target=stop_once_the_restarted_one_lived_past_the_limit).start()
    supervisor.run()

    kills = [(at, fields) for at, kind, fields in events if kind == "killed"]
    frozen_at = float(log.read_text().split("frozen ")[1].split()[0])
    assert len(kills) == 1, kills  # the stop at the end took SIGTERM alone
    ((killed_at, killed),) = kills
    assert killed["name"] == "reward-0"
    assert "silent for" in str(killed["why"]) and "holds the GIL" in str(killed["why"])
    assert _STALL_S - PULSE_S <= killed_at - frozen_at <= _BOUND_S
    assert log_starts(log) == 2  # started again, and that one was left alone
    restarts = [f for _, kind, f in events if kind == "started" and f["name"] == "reward-0"]
    assert [f["restart"] for f in restarts] == [0, 1]
    quiet = [f for _, kind, f in events if kind == "started" and f["name"] == "quiet-0"]
    assert len(quiet) == 1


def log_starts(log: Path) -> int:
    return log.read_text().count("start") if log.exists() else 0


def test_a_supervisor_that_was_not_listening_does_not_take_the_gap_for_silence(
    tmp_path: Path,
) -> None:
    """The whole machine paused (or the supervisor went unscheduled): the children's
    silence then is no sign that they froze."""
    pulses = Pulses(_STALL_S)
    proc = pulses.spawn(
        [sys.executable, "-c", BEATING], tmp_path / "beating.log", {"PYTHONUNBUFFERED": "1"}
    )
    try:
        deadline = time.monotonic() + 20
        while (tmp_path / "beating.log").read_text().count("up") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert pulses.frozen() == {}
        os.kill(proc.pid, signal.SIGSTOP)  # it and the supervisor paused together...
        time.sleep(_STALL_S + 1.0)
        os.kill(proc.pid, signal.SIGCONT)
        assert pulses.frozen() == {}  # ...so its silence counted for nothing
        os.kill(proc.pid, signal.SIGSTOP)  # frozen alone, with the supervisor looking
        deadline = time.monotonic() + _BOUND_S
        while not pulses.frozen():
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
        pulses.frozen()  # forgets it, closing its pipe


BEATING = """
import time
from asyncrl.runtime.contract.pulse import start_pulse
start_pulse()
print("up")
time.sleep(60)
"""
