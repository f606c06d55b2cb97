"""How a child process is started and, at the last resort, killed.

A child gets its own session, so a terminal's Ctrl-C reaches only the supervisor, which then
stops children in order. On Linux it also asks the kernel for SIGKILL when its parent dies
(PR_SET_PDEATHSIG), so even a `kill -9` of the supervisor leaves no orphan behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from asyncrl.runtime.contract.logs import LOG_FILE_ENV

__all__ = ["kill", "spawn"]

_PR_SET_PDEATHSIG = 1


def _find_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # libc, already loaded by Python
    except (OSError, AttributeError):  # not Linux
        return None


# Looked up once, here, so the child runs no more Python between fork and exec than it must.
_PRCTL = _find_prctl()


def spawn(
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start `argv` with stdout and stderr appended to `log_path` (0600), and `env` added to
    ours; of our descriptors it gets only `pass_fds`. The child is told the path
    (LOG_FILE_ENV): its logging rotates the file."""
    full_env = {**os.environ, **(env or {}), LOG_FILE_ENV: str(log_path)}
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with open(fd, "ab") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            preexec_fn=_die_with_parent(os.getpid()),
        )


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child that has not been reaped, and its process group with it.

    The group is the child's whole tree unless a descendant moved out: a worker's own
    subprocesses (an inference engine, say) go too, where PR_SET_PDEATHSIG would not reach.
    """
    if proc.returncode is None:  # not reaped, so the pid (and group id) is still ours
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.kill()  # in case the child left its group; a no-op once it is reaped


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    prctl = _PRCTL
    if prctl is None:
        return None
    sigkill = int(signal.SIGKILL)

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill)
        if os.getppid() != parent_pid:  # the parent died before the request took effect
            os.kill(os.getpid(), sigkill)

    return in_child
