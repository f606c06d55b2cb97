"""The process supervisor behind `asyncrl run`: a scheduler and its workers on one machine.

The first spec with `restart=False` is the *primary* (the scheduler): when it exits the run is
over, and `run()` returns its exit status; unless it failed and has a `resume_argv`, which
starts it again (the scheduler resuming from its journal) with the workers left running,
or it exited `STOPS_THE_RUN`: the run cannot go on (its reason is on the terminal).
Without a primary (a machine of a run whose scheduler is elsewhere) the run is over for the
supervisor when every child has left on purpose, or when `finish()` says so.
A child with `restart=True` (a worker) is started again whenever it fails (exits non-zero
or by a signal), after a delay that doubles from `backoff_initial_s` up to `backoff_max_s`
and starts over once the child has lived `healthy_after_s` or said it came up (a crash or a
`kill -9` after a good start is no crash loop). A worker that exits 0 left on purpose and
is not started again; one alive but frozen (pulse.py, `stall_after_s`) is killed, so
restarted; one that exits `STOPS_THE_RUN` said no restart can help, and the run stops with
its reason. What a running child asks to be told (`note_warning`) goes to the terminal as
it comes, each line once.

Stopping (SIGINT or SIGTERM to the supervisor, `request_stop()`, the primary's exit, or a child
past `max_restarts`) drains the workers before the scheduler they report to:

1. SIGTERM to every child but the primary; wait up to `stop_grace_s` for them;
2. SIGTERM to the primary; wait up to `stop_grace_s`;
3. SIGKILL to whatever is left, each with its process group.

Children that share a `gang` (the ranks of a training group) live and die together: when
one fails, the others are killed at once and all start again together, after the failed
one's delay, with a fresh leader address in their environment (gangs.ENV_ADDR). A gang
whose other ranks other machines run (`gang_across_machines`) is given no address: its
leader announces where it listens in the run directory (gangs.py); its ranks here restart
together all the same, and those elsewhere find their leader gone and restart too.

A child that fails to start `crash_loop_starts` times in a row the same way would fail
again: the run stops with its reason on the terminal instead of restarting it forever. Each
child is told where to say how far its start got and why it failed (child_status.py); a
child that came up before it failed (a crash, a `kill -9` of a running worker) is restarted
as ever, unless it failed in its own words before its first piece of work, which its next
start would meet too (_start_failures.py). The reason is the child's own, else how it
ended: its signal, or the last line it wrote since this start.

A second SIGINT or SIGTERM during a stop jumps to step 3. Each child's stdout and stderr are
appended to `log_dir/<name>.log`; see `_spawn` for how children die with the supervisor.

Exits are found by polling every `_TICK_S` with `waitpid(WNOHANG)` (through `Popen.poll`): a
handful of syscalls twenty times a second, and no signal handler for SIGCHLD to share with
the embedding program.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from asyncrl.runtime.contract.child_status import (
    STATUS_ENV,
    STOPS_THE_RUN,
    ChildStatus,
    read_status,
)
from asyncrl.runtime.contract.gangs import ENV_ADDR, free_local_address
from asyncrl.runtime.launch.pulses import Pulses

from ._backoff import Backoff
from ._spawn import kill
from ._start_failures import StartFailures
from .last_words import last_words
from .supervisor_events import EventKind, how_it_ended, print_event, shell_status, signal_name

__all__ = ["ChildSpec", "OnEvent", "Supervisor"]

OnEvent = Callable[[str, dict[str, object]], None]
"""Called as `on_event(kind, fields)`; `kind` is an `EventKind`, `fields` as listed there."""

_TICK_S = 0.05  # how long an exit or a stop request can go unnoticed
_HEAR_S = 1.0  # how often running children's status files are read for warnings
_FINISH_GRACE_S = 10.0  # for workers to leave by themselves once the run has finished
_INTERRUPTED = 130  # the shell's status for a command ended by Ctrl-C
_GAVE_UP = 1


@dataclass(frozen=True)
class ChildSpec:
    name: str  # "scheduler", "generate-0", ...: names the log file too
    argv: Sequence[str]  # the full command line
    restart: bool  # workers: True; the scheduler: False
    # Added to the supervisor's environment. It may hold a worker key: never in a repr.
    env: Mapping[str, str] | None = field(default=None, repr=False)
    gang: str | None = None  # members of one gang restart together (see the module doc)
    gang_across_machines: bool = False  # the gang's other ranks are on other machines
    # The primary only: the command line that starts it again after a failure (the
    # scheduler resuming from its journal); None: its exit, however it ends, ends the run.
    resume_argv: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ValueError(f"child name {self.name!r} cannot name a log file")
        if not self.argv:
            raise ValueError(f"child {self.name!r} has an empty command line")
        if self.gang is not None and not self.restart:
            raise ValueError(f"child {self.name!r}: only restarted children form gangs")


@dataclass(slots=True)
class _Child:
    """One spec's live state: its current process, if any, and its restart history."""

    spec: ChildSpec
    primary: bool
    backoff: Backoff
    failures: StartFailures
    proc: subprocess.Popen[bytes] | None = None  # None once its exit was seen
    started_at: float = 0.0
    log_offset: int = 0  # the size of its log when it last started: where its words begin
    restarts: int = 0
    restart_at: float | None = None  # when a pending restart is due (monotonic)
    warned: int = 0  # warnings of this start already on the terminal


class Supervisor:
    """Runs `specs` as child processes until the primary exits or a stop is requested."""

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        log_dir: Path,
        *,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 10.0,
        healthy_after_s: float = 30.0,
        stop_grace_s: float = 15.0,
        max_restarts: int | None = None,
        crash_loop_starts: int = 3,
        stall_after_s: float | None = None,
        on_event: OnEvent | None = None,
    ) -> None:
        _check_specs(specs)
        if not 0 < backoff_initial_s <= backoff_max_s:
            raise ValueError("need 0 < backoff_initial_s <= backoff_max_s")
        if crash_loop_starts < 0:
            raise ValueError("need crash_loop_starts >= 0 (0: never give up on a child)")
        primary = next((spec for spec in specs if not spec.restart), None)
        backoff = (backoff_initial_s, backoff_max_s, healthy_after_s)
        self._children = [
            _Child(
                spec,
                spec is primary,
                Backoff(*backoff),
                StartFailures(crash_loop_starts, healthy_after_s),
            )
            for spec in specs
        ]
        self._log_dir = log_dir
        self._grace_s = stop_grace_s
        self._max_restarts = max_restarts
        self._on_event = on_event or print_event
        self._pulses = Pulses(stall_after_s)
        self._ran = False
        # Written by signal handlers and other threads; plain assignments, read by the loop.
        self._stop_reason: str | None = None
        self._interrupted = False
        self._kill_now = False
        self._gave_up = False
        self._primary_status: int | None = None
        gangs = {spec.gang for spec in specs if spec.gang and not spec.gang_across_machines}
        self._gang_addr = {gang: free_local_address() for gang in gangs}

    def run(self) -> int:
        """Start every child, supervise them until the run ends, and stop them all.

        Returns the primary's exit status (128 + N for signal N), 130 for a stop begun by
        SIGINT, 1 when a child went past `max_restarts` or failed to start the same way
        `crash_loop_starts` times in a row. Signal handlers for SIGINT and SIGTERM are
        installed only when called in the main thread, and restored on return.
        """
        if self._ran:
            raise RuntimeError("a Supervisor runs once; make a new one")
        self._ran = True
        self._log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._signal_handlers():
            try:
                for child in self._children:
                    self._start(child)
                self._supervise()
                self._stop_all()
            except BaseException:
                _kill_all(self._children)  # whatever went wrong, no child outlives run()
                raise
        code = self._exit_status()
        self._emit(EventKind.DONE, code=code)
        return code

    def request_stop(self) -> None:
        """Begin an orderly stop; safe from any thread or a signal handler."""
        self._begin_stop("stop requested")

    def finish(self, reason: str) -> None:
        """The run is over (found elsewhere): workers leave by themselves, as after the
        primary's exit 0, and then the rest are stopped; safe from any thread."""
        if self._stop_reason is None and self._primary_status is None:
            self._primary_status = 0
        self._begin_stop(reason)

    def _supervise(self) -> None:
        heard_at = 0.0
        while True:
            frozen = self._pulses.frozen()
            for child in self._children:
                if child.proc is not None and child.proc.pid in frozen:
                    self._kill(child, child.proc, frozen[child.proc.pid])  # and so restart it
                self._reap(child)
            if time.monotonic() - heard_at >= _HEAR_S:
                heard_at = time.monotonic()
                self._hear_warnings()
            if self._stop_reason is None and self._all_left():
                self.finish("every worker has left")
            if self._stop_reason is not None:
                return
            now = time.monotonic()
            for child in self._children:
                if child.restart_at is not None and child.restart_at <= now:
                    self._start(child)
            time.sleep(self._pause_s())

    def _hear_warnings(self) -> None:
        for child in self._children:
            said = read_status(self._status_path(child)).warnings if child.proc else ()
            for text in said[child.warned :]:
                self._emit(EventKind.WARNING, name=child.spec.name, text=text)
            child.warned = max(child.warned, len(said))

    def _all_left(self) -> bool:
        """No primary, and no child running or due to start again."""
        children = self._children
        if any(child.primary for child in children):
            return False
        return all(child.proc is None and child.restart_at is None for child in children)

    def _stop_all(self) -> None:
        self._emit(EventKind.STOPPING, reason=self._stop_reason)
        for child in self._children:
            child.restart_at = None
        workers = [child for child in self._children if not child.primary]
        if self._primary_status == 0 and not self._kill_now:
            # The run finished: the scheduler told every worker so, and they are on their
            # way out (the trainer writing its last checkpoint). A SIGTERM now would land
            # in the middle of their exit.
            deadline = time.monotonic() + min(self._grace_s, _FINISH_GRACE_S)
            while _procs(workers) and not self._kill_now and time.monotonic() < deadline:
                time.sleep(_TICK_S)
                for child in workers:
                    self._reap(child)
        self._stop_group(workers)
        self._stop_group([child for child in self._children if child.primary])

    def _stop_group(self, group: list[_Child]) -> None:
        """SIGTERM, wait out the grace period (or a second signal), then SIGKILL."""
        if not self._kill_now:
            # Only the child itself: a worker shuts down the processes it started.
            for proc in _procs(group):
                proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + self._grace_s
            while _procs(group) and not self._kill_now and time.monotonic() < deadline:
                time.sleep(min(_TICK_S, max(0.0, deadline - time.monotonic())))
                for child in group:
                    self._reap(child)
        late = f"still running {self._grace_s:g}s after SIGTERM"
        why = "second stop signal" if self._kill_now else late
        for child in group:
            if child.proc is not None:
                self._kill(child, child.proc, why)

    def _kill(self, child: _Child, proc: subprocess.Popen[bytes], why: str) -> None:
        kill(proc)
        self._emit(EventKind.KILLED, name=child.spec.name, pid=proc.pid, why=why)
        proc.wait()
        self._reap(child)

    def _start(self, child: _Child) -> None:
        child.restart_at = None
        log_path = self._log_dir / f"{child.spec.name}.log"
        status_path = self._status_path(child)
        status_path.unlink(missing_ok=True)  # what it says is about this start only
        child.warned = 0
        env = {**(child.spec.env or {}), STATUS_ENV: str(status_path)}
        if child.spec.gang in self._gang_addr:
            env[ENV_ADDR] = self._gang_addr[child.spec.gang]
        resuming = child.restarts > 0 and child.spec.resume_argv is not None
        argv = child.spec.resume_argv if resuming else child.spec.argv
        child.log_offset = log_path.stat().st_size if log_path.exists() else 0
        child.proc = self._pulses.spawn(argv, log_path, env)
        child.started_at = time.monotonic()
        self._emit(
            EventKind.STARTED, name=child.spec.name, pid=child.proc.pid, restart=child.restarts
        )

    def _reap(self, child: _Child) -> None:
        """If `child` has exited, report it and decide what follows: a restart, or the end."""
        proc = child.proc
        if proc is None or proc.poll() is None:
            return
        child.proc = None
        lived_s = round(time.monotonic() - child.started_at, 3)
        how = how_it_ended(proc.returncode)
        said = read_status(self._status_path(child)).reason if proc.returncode else None
        if said is not None:
            how["why"] = said  # its own one line, on the terminal with its exit
        self._emit(EventKind.EXITED, name=child.spec.name, pid=proc.pid, lived_s=lived_s, **how)
        if child.primary:
            if self._resumes(child, proc.returncode, lived_s):
                return
            self._primary_status = shell_status(proc.returncode)
            self._begin_stop(f"{child.spec.name} exited")
        elif child.spec.restart and proc.returncode == STOPS_THE_RUN:  # no restart can help
            self._gave_up = True
            self._begin_stop(f"{child.spec.name} cannot go on: {said}")
        elif child.spec.restart and self._stop_reason is None and proc.returncode != 0:
            # Exit 0 is a worker leaving on purpose (the run is over): not a failure.
            if self._failing_every_start(child, proc.returncode, lived_s):
                return
            if child.spec.gang is None:
                self._schedule_restart(child, lived_s)
            else:
                self._restart_gang(child, lived_s)

    def _resumes(self, primary: _Child, returncode: int, lived_s: float) -> bool:
        """A primary that failed (not one that finished) starts again, resuming, unless the
        run is stopping or it fails the same way every start."""
        if returncode in (0, STOPS_THE_RUN):  # finished, or said that no restart can help
            return False
        if primary.spec.resume_argv is None or self._stop_reason is not None:
            return False
        if self._failing_every_start(primary, returncode, lived_s):
            self._primary_status = shell_status(returncode)
            return False
        self._schedule_restart(primary, lived_s)
        return self._stop_reason is None

    def _failing_every_start(self, child: _Child, returncode: int, lived_s: float) -> bool:
        """Whether ``child`` failed to start the same way on its last starts: then
        restarting it again is pointless; the run stops with its reason."""
        status = read_status(self._status_path(child))
        if status.started_well:  # killed or crashed after a good start: no delay
            child.backoff.came_up()
        reason = self._reason(child, returncode, status)
        if not child.failures.record(status, lived_s, reason):
            return False
        self._gave_up = True
        starts = child.failures.count
        self._emit(EventKind.FAILING, name=child.spec.name, starts=starts, reason=reason)
        self._begin_stop(f"{child.spec.name} fails on every start")
        return True

    def _reason(self, child: _Child, returncode: int, status: ChildStatus) -> str:
        """Why ``child`` failed: in its own words, else how it ended."""
        if status.reason is not None:
            return status.reason
        if returncode < 0:
            return f"ended by {signal_name(-returncode)}"
        log = self._log_dir / f"{child.spec.name}.log"
        return last_words(log, since=child.log_offset) or f"exit code {returncode}"

    def _status_path(self, child: _Child) -> Path:
        return self._log_dir / f"{child.spec.name}.status"

    def _restart_gang(self, failed: _Child, lived_s: float) -> None:
        """A member failed: the rest of its gang cannot go on without it; all start again."""
        gang = failed.spec.gang
        members = [c for c in self._children if c.spec.gang == gang and c is not failed]
        for member in members:
            proc, member.proc = member.proc, None  # out of _reap's sight: no restart of its own
            if proc is not None:
                kill(proc)
                proc.wait()
                why = f"{failed.spec.name} of its gang failed"
                self._emit(EventKind.KILLED, name=member.spec.name, pid=proc.pid, why=why)
        self._schedule_restart(failed, lived_s)
        if failed.restart_at is None:
            return  # gave up
        if gang in self._gang_addr:
            self._gang_addr[gang] = free_local_address()  # the old leader's port may linger
        for member in members:
            member.restarts += 1
            member.restart_at = failed.restart_at

    def _schedule_restart(self, child: _Child, lived_s: float) -> None:
        if self._max_restarts is not None and child.restarts >= self._max_restarts:
            self._gave_up = True
            self._emit(
                EventKind.GAVE_UP,
                name=child.spec.name,
                restarts=child.restarts,
                max_restarts=self._max_restarts,
            )
            self._begin_stop(f"{child.spec.name} kept exiting")
            return
        delay_s = child.backoff.delay_after(lived_s)
        child.restarts += 1
        child.restart_at = time.monotonic() + delay_s
        self._emit(
            EventKind.RESTARTING, name=child.spec.name, delay_s=delay_s, restart=child.restarts
        )

    def _pause_s(self) -> float:
        """Sleep one tick, or less when a restart falls due sooner."""
        now = time.monotonic()
        due = [child.restart_at - now for child in self._children if child.restart_at is not None]
        return max(0.0, min([_TICK_S, *due]))

    def _begin_stop(self, reason: str, *, interrupted: bool = False) -> None:
        if self._stop_reason is None:
            self._interrupted = interrupted
            self._stop_reason = reason

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._stop_reason is not None:
            self._kill_now = True  # a second Ctrl-C: the user has waited long enough
        else:
            name = signal.Signals(signum).name
            self._begin_stop(f"got {name}", interrupted=signum == signal.SIGINT)

    @contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                # None: a handler not installed from Python, which cannot be put back as it was.
                signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    def _exit_status(self) -> int:
        if self._gave_up:
            return _GAVE_UP
        if self._interrupted:
            return _INTERRUPTED
        return 0 if self._primary_status is None else self._primary_status

    def _emit(self, kind: EventKind, **fields: object) -> None:
        self._on_event(kind, fields)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _check_specs(specs: Sequence[ChildSpec]) -> None:
    if not specs:
        raise ValueError("no children to supervise")
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"child names must be unique (they name log files): {duplicates}")


def _procs(group: list[_Child]) -> list[subprocess.Popen[bytes]]:
    """The processes of those in `group` still running, as far as the last poll knows."""
    return [child.proc for child in group if child.proc is not None]


def _kill_all(children: list[_Child]) -> None:
    for proc in _procs(children):
        kill(proc)
        proc.wait()
