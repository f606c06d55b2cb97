"""A supervised child's pulse: how its supervisor tells a frozen process from a busy one.

A process can live without running: stopped (SIGSTOP, a debugger), or inside one C call
that holds the GIL (a verifier computing a tower of powers), so that none of its threads
runs, its heartbeats to the scheduler included. The scheduler then takes its leases
back, but only the supervisor, which started the process, can end it. So a child that
takes part (:func:`start_pulse`) writes a byte every ``PULSE_S`` to a pipe its supervisor
gave it (``ASYNCRL_PULSE_FD``), from a thread of its own; the supervisor's side
(``runtime/launch/pulses.py``) names each child that has beaten and then been silent too
long, for the supervisor to kill and restart as it does any killed worker.

A child that never beats (the scheduler, ranks > 0 of a group) is not watched; a worker
beats from the moment it is up, since its start may hold the GIL for long (loading native
libraries). Without the variable (a process started by hand) :func:`start_pulse` does
nothing.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["PULSE_ENV", "PULSE_S", "start_pulse"]

PULSE_ENV = "ASYNCRL_PULSE_FD"
PULSE_S = 0.5  # a byte each: a pipe's 64 KiB hold nine hours of a supervisor not reading


def start_pulse() -> None:
    """Beat on the supervisor's pipe, if it gave one, until this process ends."""
    given = os.environ.pop(PULSE_ENV, None)  # not for this process's own children
    if not given:
        return
    try:
        fd = int(given)
        os.set_blocking(fd, False)  # a beat never waits for a supervisor that is behind
    except (ValueError, OSError):
        return  # a courtesy to the supervisor: a bad variable must not stop the worker
    threading.Thread(target=_beat, args=(fd,), name="pulse", daemon=True).start()


def _beat(fd: int) -> None:
    while True:
        try:
            os.write(fd, b".")
        except BlockingIOError:
            pass  # the pipe is full: the supervisor reads it whole next time
        except OSError:
            return  # the supervisor is gone
        time.sleep(PULSE_S)
