"""A snapshot dumped and written by a forked child, so that the writing thread goes on.

Turning a large state into plain data and packing it is Python work on every object: for
18,500 groups about 60 ms, during which a scheduler answers nobody. A forked child sees the
state as it was at the fork (its pages are shared copy-on-write), so it can do that work
while the parent goes on; the parent's pause is the fork itself (2 ms for a process
holding 18,500 groups when idle, 8 to 11 ms in the scale bench at 1,024 workers). The
child writes and fsyncs the snapshot's temp file and exits; the parent puts the file in
place once it has reaped the child (``JournalWriter.poll_snapshot``).

The child of a process with threads may use only what it made itself: it touches no lock,
socket or logger of the parent, runs no collector (a finalizer could close a parent's
socket), ignores the signals meant for its parent, dies with its parent rather than
outliving it, and leaves with ``os._exit``. What went wrong in it comes back through a pipe.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._files import write_snapshot_temp

__all__ = ["ChildOutcome", "SnapshotChild"]

FORK_AVAILABLE = hasattr(os, "fork")
_ERROR_BYTES = 2000  # what the child may say of its failure: within a pipe's buffer
_PR_SET_PDEATHSIG = 1


def _find_prctl() -> Callable[..., int] | None:
    """prctl, looked up before any fork: the child must not load libraries itself."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _find_prctl()


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    ok: bool
    cpu_s: float  # the child's user and system time: what the snapshot cost the machine
    error: str  # why it failed, in a line ("" when ok)


class SnapshotChild:
    """One forked child writing one snapshot; the parent polls it until it has ended."""

    def __init__(self, pid: int, errors: int) -> None:
        self.pid = pid
        self._errors = errors  # the read end of the child's error pipe

    @classmethod
    def start(
        cls, root: Path, seq: int, make_frame: Callable[[], bytes], close_in_child: tuple[int, ...]
    ) -> SnapshotChild:
        """Fork a child that writes ``make_frame()`` as snapshot ``seq``'s temp file in
        ``root``. ``close_in_child``: descriptors the child must not keep (the journal's
        lock, which an orphan would otherwise hold). Raises ``OSError`` if the fork fails."""
        if not FORK_AVAILABLE:  # the caller snapshots on its own thread, as for a failed fork
            raise OSError("this platform cannot fork")
        read_end, write_end = os.pipe()  # not inherited by exec: Python makes them so
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError:
            os.close(read_end)
            os.close(write_end)
            raise
        if pid == 0:  # pragma: no cover - runs in the child, which leaves by os._exit
            _child_main(root, seq, make_frame, (read_end, *close_in_child), write_end, parent)
        os.close(write_end)
        return cls(pid, read_end)

    def poll(self) -> ChildOutcome | None:
        """The outcome once the child has ended (it is reaped then); None while it runs."""
        return self._reap(os.WNOHANG)

    def wait(self) -> ChildOutcome:
        outcome = self._reap(0)
        assert outcome is not None
        return outcome

    def _reap(self, options: int) -> ChildOutcome | None:
        try:
            pid, status, usage = os.wait4(self.pid, options)
        except ChildProcessError:  # a wait for any child elsewhere in the process took it
            os.close(self._errors)
            return ChildOutcome(False, 0.0, "its exit status was taken by another wait")
        if pid == 0:
            return None
        cpu = usage.ru_utime + usage.ru_stime
        said = _read_all(self._errors)
        os.close(self._errors)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            return ChildOutcome(True, cpu, "")
        why = said or (f"killed by signal {-code}" if code < 0 else f"exit status {code}")
        return ChildOutcome(False, cpu, why)


def _read_all(fd: int) -> str:
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace").strip()


def _child_main(
    root: Path,
    seq: int,
    make_frame: Callable[[], bytes],
    close: tuple[int, ...],
    errors: int,
    parent: int,
) -> None:  # pragma: no cover - runs in the child
    code = 1
    try:
        gc.disable()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the scheduler
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)
        for fd in close:
            os.close(fd)
        write_snapshot_temp(root, seq, make_frame())
        code = 0
    except BaseException as error:
        with contextlib.suppress(BaseException):
            line = f"{type(error).__name__}: {error}".encode(errors="replace")
            os.write(errors, line[:_ERROR_BYTES])
    finally:
        os._exit(code)
