"""A supervised child's pulse: how its supervisor tells a frozen process from a busy one.

A process can live without running: stopped (SIGSTOP, a debugger), or inside one C call
that holds the GIL (a verifier computing a tower of powers), so that none of its threads
runs, its heartbeats to the scheduler included. The scheduler then takes its leases
back, but only the supervisor, which started the process, can end it. So a child that
takes part (:func:`start_pulse`) writes a byte every ``PULSE_S`` to a pipe its supervisor
gave it (``ASYNCRL_PULSE_FD``), from a thread of its own; :class:`Pulses`, on the
supervisor's side, names each child that has beaten and then been silent
``stall_after_s``, for the supervisor to kill and restart as it does any killed worker.

A child that never beats (the scheduler, ranks > 0 of a group) is not watched; a worker
beats from the moment it is up, since its start may hold the GIL for long (loading native
libraries). Without the variable (a process started by hand) :func:`start_pulse` does
nothing.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ._spawn import spawn

__all__ = ["PULSE_ENV", "PULSE_S", "Pulses", "start_pulse"]

PULSE_ENV = "ASYNCRL_PULSE_FD"
PULSE_S = 0.5  # a byte each: a pipe's 64 KiB hold nine hours of a supervisor not reading
_NOT_LISTENING_S = 4 * PULSE_S  # a gap between two looks longer than this: start over


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


@dataclass(slots=True)
class _Watch:
    proc: subprocess.Popen[bytes]
    fd: int  # the pipe's end the supervisor reads
    heard_at: float | None = None  # the last beat (monotonic); None: it never beat


class Pulses:
    """The supervisor's side: a pipe for each child it starts, and which of them froze.
    ``stall_after_s`` None: no pipes, nobody watched."""

    def __init__(self, stall_after_s: float | None) -> None:
        # A few beats' time at least: a live child is never killed between two beats.
        self.stall_after_s = None if stall_after_s is None else max(stall_after_s, 4 * PULSE_S)
        self._watches: dict[int, _Watch] = {}  # by pid
        self._looked_at: float | None = None  # the last call of frozen() (monotonic)

    def spawn(
        self, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None
    ) -> subprocess.Popen[bytes]:
        """:func:`~._spawn.spawn`, with the write end of a fresh pipe given to the child."""
        if self.stall_after_s is None:
            return spawn(argv, log_path, env)
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        try:
            proc = spawn(argv, log_path, {**(env or {}), PULSE_ENV: str(write_fd)}, (write_fd,))
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the child's copy is the only one: its death closes the pipe
        self._watches[proc.pid] = _Watch(proc, read_fd)
        return proc

    def frozen(self) -> dict[int, str]:
        """The children (by pid) that beat and then fell silent, each with why it is
        killed; forgets those that have ended."""
        now = time.monotonic()
        if self._looked_at is not None and now - self._looked_at > _NOT_LISTENING_S:
            # Nobody listened for a while (the machine paused, or this process was not
            # run): a silence measured then says nothing about the children.
            for watch in self._watches.values():
                watch.heard_at = None if watch.heard_at is None else now
        self._looked_at = now
        found: dict[int, str] = {}
        for pid, watch in list(self._watches.items()):
            if watch.proc.returncode is not None or not self._listen(watch, now):
                os.close(watch.fd)
                del self._watches[pid]
            elif watch.heard_at is not None and now - watch.heard_at > self.stall_after_s:
                silent_s = now - watch.heard_at
                found[pid] = (
                    f"alive but silent for {silent_s:.1f}s (its pulse stopped: stopped, or "
                    f"stuck in a call that holds the GIL; limit {self.stall_after_s:g}s)"
                )
        return found

    def _listen(self, watch: _Watch, now: float) -> bool:
        """Take the beats waiting in ``watch``'s pipe; False once it is closed."""
        try:
            beats = os.read(watch.fd, 1 << 16)
        except BlockingIOError:
            return True
        if not beats:
            return False  # every writer is gone: the child has ended (its exit is reaped)
        watch.heard_at = now
        return True
