"""The supervisor's side of its children's pulses (``runtime/contract/pulse.py``): a pipe
for each child it starts, and which of them beat and then fell silent ``stall_after_s``,
to be killed and restarted as any killed worker is."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncrl.runtime.contract.pulse import PULSE_ENV, PULSE_S
from asyncrl.runtime.launch._spawn import spawn

__all__ = ["Pulses"]

_NOT_LISTENING_S = 4 * PULSE_S  # a gap between two looks longer than this: start over


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
