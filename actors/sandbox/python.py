"""Running model-written Python where it can harm nothing: :func:`run_python`.

Each run is three processes (:mod:`.launcher` says what each does): the program runs in
its own mount, network, PID, IPC and UTS namespaces, with no network device but a
loopback that is down, in a root of its own (read-only: the interpreter's directories and
four devices; writable: a small tmpfs at /tmp, its directory), under an unprivileged uid of
its own, with limits on its address space, processes, file size and open files. The
caller reads its output with a cap and ends it at the time limit; ending it is killing the
namespace's init, after which the kernel leaves no process of it alive, and the mounts
went with the namespace: nothing of a run outlives :func:`run_python`.

A process's runs are launched by its fork server (started at its first run, kept for its
life), so a run pays one interpreter start, the program's. The caller's side of a run is
three pipes and a control socket, never a signal sent to a process id it might have lost:
the launcher, its own child's parent, does the killing, and it does it too when the
caller's end of the socket closes (a kill asked for, or the caller dead). The launcher
closes its end with its last act, after its init, so the end of that socket is the end of
everything the run was.

Root gets a uid per run (its processes counted apart from every other run's); another
user gets a user namespace of its own, where it can. Where neither works, a run raises
:class:`SandboxUnavailable` and :func:`sandbox_problem` says why in one line.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CodeLimits", "CodeRun", "SandboxUnavailable", "run_python", "sandbox_problem"]

_LAUNCHER = str(Path(__file__).with_name("launcher.py"))
# What the interpreter needs from the host, bound read-only at the same paths (those that
# exist; a symbolic link is made again as a link).
_SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache")
# A per-run uid is this plus the launcher's process id: far above any account's, and the
# range allocates nothing (the kernel counts a uid's processes only while it has some).
_UID_BASE = 0xC000_0000
_NOBODY = 65534
_USER_NAMESPACE = -1
# How long the caller waits, past a kill it asked for, before it kills the launcher itself.
_GRACE_S = 2.0
_CHUNK = 1 << 16


class SandboxUnavailable(RuntimeError):
    """This machine cannot give a program the sandbox: the message says why."""


@dataclass(frozen=True, slots=True)
class CodeLimits:
    """What one run may use. ``processes`` counts threads too (the kernel does)."""

    timeout_s: float = 5.0
    memory_mb: int = 256  # address space of each process
    processes: int = 16
    output_bytes: int = 65536  # each of stdout and stderr
    file_bytes: int = 1 << 20  # all it writes, and so each file

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "processes", "output_bytes", "file_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CodeLimits.{name} must be positive, not {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class CodeRun:
    """What a run did. ``reason`` says in one line why it is not ``ok``; ``exit_code`` is
    the program's status, negative for the signal that ended it, None when it was killed
    at a limit; ``stdout`` and ``stderr`` are what it printed, cut at the output limit."""

    ok: bool
    exit_code: int | None
    stdout: str
    stderr: str
    reason: str | None
    seconds: float


@dataclass(frozen=True, slots=True)
class _Plan:
    """How runs start on this machine: found once, by running a probe."""

    python: str
    binds: tuple[str, ...]
    uid: int  # _USER_NAMESPACE, or a uid (plus the launcher's pid when per_run)
    per_run: bool


def run_python(source: str, *, stdin: str = "", limits: CodeLimits = CodeLimits()) -> CodeRun:
    """Run ``source`` with ``python -I -S`` (the standard library only) in the sandbox,
    ``stdin`` as its input. Returns within the time limit and a small margin, whatever the
    program does; raises :class:`SandboxUnavailable` when no sandbox can be made here."""
    return _run(_plan(), source, stdin, limits)


def sandbox_problem() -> str | None:
    """Why this machine cannot run a program in its own namespaces (one line); None when it
    can. Found by running a program: once per process when it works, again at each call
    while it does not."""
    try:
        _plan()
    except SandboxUnavailable as error:
        return str(error)
    return None


# A plan that works is kept for the process; a failure is not (functools.cache keeps no
# exception), so a passing fault, or a machine set right, is seen at the next call.
@functools.cache
def _plan() -> _Plan:
    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    binds = _binds(python)
    candidates = []
    if os.geteuid() == 0:
        candidates.append(_root_plan(python, binds))
    candidates.append(_Plan(python, binds, _USER_NAMESPACE, per_run=False))
    problems = []
    for plan in candidates:
        problem = _probe(plan)
        if problem is None:
            return plan
        problems.append(problem)
    raise SandboxUnavailable("; ".join(dict.fromkeys(problems)))


def _binds(python: str) -> tuple[str, ...]:
    paths = [path for path in _SYSTEM_PATHS if os.path.lexists(path)]
    for extra in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python)):
        real = os.path.realpath(extra)
        if not any(real == path or real.startswith(path + "/") for path in paths):
            paths.append(real)
    return tuple(paths)


def _root_plan(python: str, binds: tuple[str, ...]) -> _Plan:
    """A uid of its own for each run where the uid map allows it, else nobody's."""
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        ranges = [
            tuple(int(field) for field in line.split())
            for line in Path("/proc/self/uid_map").read_text().splitlines()
        ]
    except (OSError, ValueError):
        return _Plan(python, binds, _NOBODY, per_run=False)
    wanted = (_UID_BASE, _UID_BASE + pid_max)
    if any(start <= wanted[0] and wanted[1] < start + count for start, _, count in ranges):
        return _Plan(python, binds, _UID_BASE, per_run=True)
    return _Plan(python, binds, _NOBODY, per_run=False)


def _probe(plan: _Plan) -> str | None:
    try:
        run = _run(plan, "print(6 * 7)", "", CodeLimits(timeout_s=30.0))
    except SandboxUnavailable as error:
        return str(error)
    if not run.ok or run.stdout != "42\n":
        return f"a probe program failed in the sandbox: {run.reason or repr(run.stdout)}"
    return None


def _run(plan: _Plan, source: str, stdin: str, limits: CodeLimits) -> CodeRun:
    code = source.encode("utf-8", "surrogatepass")
    payload = code + stdin.encode("utf-8", "surrogatepass")
    argv = [
        str(len(code)), repr(limits.timeout_s), str(limits.memory_mb << 20),
        str(limits.processes), str(limits.file_bytes), str(plan.uid),
        "1" if plan.per_run else "0", plan.python, *plan.binds,
    ]  # fmt: skip
    started = time.monotonic()
    watch = _launch(plan.python, argv, payload, limits, started)
    if not watch.status:
        # Not a word from the server, nor from a launcher: the server died with the request
        # unread (killed after its last run, before it was seen dead), and nothing ran.
        # Once more, with a fresh one.
        _server().restart()
        watch = _launch(plan.python, argv, payload, limits, started)
        if not watch.status:
            raise SandboxUnavailable("the sandbox's fork server did not start the run")
    return watch.result(time.monotonic() - started)


def _launch(
    python: str, argv: list[str], payload: bytes, limits: CodeLimits, started: float
) -> _Watch:
    """One run, from its request to the server to its end."""
    ours, theirs = socket.socketpair()
    stdin_r, stdin_w = os.pipe()
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    try:
        _server().launch(python, argv, [stdin_r, stdout_w, stderr_w, theirs.fileno()])
    except BaseException:
        for fd in (stdin_w, stdout_r, stderr_r):
            os.close(fd)
        ours.close()
        raise
    finally:
        theirs.close()
        for fd in (stdin_r, stdout_w, stderr_w):
            os.close(fd)
    watch = _Watch(stdin_w, stdout_r, stderr_r, ours, payload, limits, started)
    try:
        watch.run()
    finally:
        watch.end()
    return watch


class _Server:
    """This process's fork server (``launcher.py --serve``): started at its first run, and
    again if it died or this process is a fork of the one that started it. It ends when
    this process's end of its socket closes: at this process's exit, however it exits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._owner = 0

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process and self._owner == os.getpid() else None

    def launch(self, python: str, argv: list[str], fds: list[int]) -> None:
        """Have a launcher started with ``argv`` and ``fds``; SandboxUnavailable if the
        server cannot be (re)started."""
        message = "\0".join(argv).encode()
        with self._lock:
            for attempt in range(2):
                try:
                    socket.send_fds(self._ready(python), [message], fds)
                    return
                except OSError as error:
                    self._forget()  # it died between runs: one fresh start
                    if attempt:
                        raise SandboxUnavailable(
                            f"the sandbox's fork server did not take a run: {error}"
                        ) from None

    def restart(self) -> None:
        """Start afresh at the next run."""
        with self._lock:
            self._forget()

    def _ready(self, python: str) -> socket.socket:
        if self._owner != os.getpid() or self._process is None or self._process.poll() is not None:
            self._forget()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with theirs:
                try:
                    self._process = subprocess.Popen(
                        [python, "-I", "-S", "-B", _LAUNCHER, "--serve", str(theirs.fileno())],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        pass_fds=(theirs.fileno(),),
                        env={},  # nothing of the caller's: its secrets stay with it
                        start_new_session=True,  # a signal to the caller's group misses it
                    )
                except OSError as error:
                    ours.close()
                    raise SandboxUnavailable(f"cannot start {python}: {error}") from None
            self._socket, self._owner = ours, os.getpid()
        assert self._socket is not None
        return self._socket

    def _forget(self) -> None:
        if self._socket is not None:
            self._socket.close()  # the server leaves when it sees this
        if self._process is not None and self._owner == os.getpid():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=_GRACE_S)
        self._process, self._socket, self._owner = None, None, 0


# One per process, as the interpreter's own state is: a fork server serves the process
# that started it (and its threads), whatever asks for runs in it.
@functools.cache
def _server() -> _Server:
    return _Server()


class _Watch:
    """The caller's side of one run: feeds its input, reads its output with a cap, asks
    for the kill at a limit, and waits for the end of it."""

    def __init__(
        self,
        stdin: int,
        stdout: int,
        stderr: int,
        control: socket.socket,
        payload: bytes,
        limits: CodeLimits,
        started: float,
    ) -> None:
        self.stdin: int | None = stdin
        self.output = {stdout: bytearray(), stderr: bytearray()}
        self.control = control
        self.limits = limits
        self.deadline = started + limits.timeout_s
        self.pending = memoryview(payload)
        self.status = bytearray()
        self.launcher: int | None = None  # its process id, and a pidfd of it
        self.pidfd: int | None = None
        self.ended = False  # the control socket's end: the launcher and its run are gone
        self.killed_for: str | None = None  # "time" or "output", when the caller asked
        self.give_up_at: float | None = None

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for fd in (*self.output, self.control.fileno()):
                selector.register(fd, selectors.EVENT_READ)
            assert self.stdin is not None
            os.set_blocking(self.stdin, False)
            selector.register(self.stdin, selectors.EVENT_WRITE)
            while len(selector.get_map()) > (self.stdin is not None):
                now = time.monotonic()
                if self.killed_for is None and now >= self.deadline:
                    self._kill("time", selector)
                if self.give_up_at is not None and now >= self.give_up_at:
                    return  # end() kills the launcher outright
                until = self.give_up_at if self.give_up_at is not None else self.deadline
                for key, _ in selector.select(max(until - now, 0.0)):
                    self._ready(key.fd, selector)

    def end(self) -> None:
        """Wait for the launcher's end, which comes only once everything of the run has
        ended; kill it outright if it has not come in time (its init then dies with it,
        and the namespace with init). Then close what is left."""
        try:
            with contextlib.suppress(OSError):
                self.control.shutdown(socket.SHUT_WR)  # a kill, if it still runs
            patience = _GRACE_S if self.give_up_at is None else self.give_up_at - time.monotonic()
            ended = self.ended or self._wait_for_end(max(patience, 0.0))
            if self.pidfd is None:
                return
            if not ended:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            # The launcher closed its end with its last act; its pidfd is readable once
            # it has exited.
            select.select([self.pidfd], [], [], _GRACE_S)
        finally:
            for line in self.status.splitlines():
                if line.startswith(b"launcher "):
                    self.launcher = int(line.split()[1])
            for fd in (self.stdin, *self.output, self.pidfd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.control.close()

    def _wait_for_end(self, patience: float) -> bool:
        give_up_at = time.monotonic() + patience
        while not self.ended:
            left = give_up_at - time.monotonic()
            if left <= 0 or not select.select([self.control], [], [], left)[0]:
                return False
            self._read_control()
        return True

    def _ready(self, fd: int, selector: selectors.BaseSelector) -> None:
        if fd == self.stdin:
            self._feed(selector)
            return
        if fd == self.control.fileno():
            if not self._read_control():
                selector.unregister(fd)
            return
        try:
            chunk = os.read(fd, _CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            selector.unregister(fd)
            return
        buffer = self.output[fd]
        room = self.limits.output_bytes - len(buffer)
        buffer += chunk[: max(room, 0)]
        if len(chunk) > room and self.killed_for is None:
            self._kill("output", selector)

    def _read_control(self) -> bool:
        """Take what the control socket holds (status lines, the launcher's pidfd); False
        at its end."""
        try:
            chunk, fds, _, _ = socket.recv_fds(self.control, _CHUNK, 1)
        except OSError:
            chunk, fds = b"", []
        for fd in fds:
            if self.pidfd is None:
                self.pidfd = fd
            else:
                os.close(fd)
        if not chunk:
            self.ended = True
            return False
        self.status += chunk
        return True

    def _feed(self, selector: selectors.BaseSelector) -> None:
        assert self.stdin is not None
        try:
            written = os.write(self.stdin, self.pending[:_CHUNK])
        except BlockingIOError:
            return
        except OSError:  # it ended, or closed its input: the rest is not wanted
            written = len(self.pending)
        self.pending = self.pending[written:]
        if not self.pending:
            self._close_stdin(selector)

    def _close_stdin(self, selector: selectors.BaseSelector) -> None:
        if self.stdin is None:
            return
        if self.stdin in selector.get_map():
            selector.unregister(self.stdin)
        with contextlib.suppress(OSError):
            os.close(self.stdin)
        self.stdin = None

    def _kill(self, why: str, selector: selectors.BaseSelector) -> None:
        self.killed_for = why
        self.give_up_at = time.monotonic() + _GRACE_S
        self._close_stdin(selector)
        with contextlib.suppress(OSError):
            self.control.shutdown(socket.SHUT_WR)  # the launcher kills the run on this

    def result(self, seconds: float) -> CodeRun:
        ended: int | None = None
        timed_out = self.killed_for == "time"
        for line in self.status.decode("utf-8", "replace").splitlines():
            word, _, rest = line.partition(" ")
            if word == "error":
                raise SandboxUnavailable(f"the sandbox could not be made: {rest}")
            if word == "time":
                timed_out = True
            elif word == "exit":
                ended = int(rest)
            elif word == "signal":
                ended = -int(rest)
        stdout, stderr = (buffer.decode("utf-8", "replace") for buffer in self.output.values())
        limits = self.limits
        if self.killed_for == "output":
            reason: str | None = f"printed over {limits.output_bytes} bytes"
            ended = None
        elif ended is not None:
            reason = None if ended == 0 else _failure(ended, stderr, limits)
        elif timed_out:
            reason = f"ran past {limits.timeout_s:g} s"
        else:
            raise SandboxUnavailable(
                f"the sandbox ended without a word: {_last_line(stderr) or 'no message'}"
            )
        return CodeRun(reason is None, ended, stdout, stderr, reason, seconds)


def _failure(status: int, stderr: str, limits: CodeLimits) -> str:
    """One line for a program that ended badly, from its status and its last words."""
    if status < 0:
        name = signal.Signals(-status).name if -status in signal.valid_signals() else str(-status)
        crash = " (a crash)" if -status in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL) else ""
        return f"killed by {name}{crash}"
    last = _last_line(_without_unfinished_traceback(stderr))
    if last.startswith("MemoryError"):
        return f"over the memory limit ({limits.memory_mb} MiB)"
    if "[Errno 27] File too large" in last or "[Errno 28] No space left on device" in last:
        return f"wrote over the file limit ({limits.file_bytes} bytes)"
    if "[Errno 11] Resource temporarily unavailable" in last:
        return f"over the process limit ({limits.processes})"
    return f"exited with status {status}: {last}" if last else f"exited with status {status}"


def _without_unfinished_traceback(stderr: str) -> str:
    """``stderr`` up to its last traceback that ends in an error line.

    The processes a program forks share its stderr: one killed as the run ends (a fork
    bomb's children, when the first to fail ends it) may leave a traceback's header and
    frames after everyone's last error line, and that error line is the run's last word.
    """
    lines = stderr.rstrip().splitlines()
    while lines and (lines[-1].startswith((" ", "\t")) or _TRACEBACK.startswith(lines[-1])):
        lines.pop()  # a frame, or the header (or what of it was written), or a blank line
    return "\n".join(lines) if lines else stderr


_TRACEBACK = "Traceback (most recent call last):"


def _last_line(text: str, width: int = 300) -> str:
    for line in reversed(text.splitlines()):
        if line.strip():
            line = line.strip()
            return line if len(line) <= width else line[: width - 3] + "..."
    return ""
