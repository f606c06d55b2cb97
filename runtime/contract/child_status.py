"""What a supervised child tells its supervisor about a start: how far it got, and why it
failed.

The supervisor names one file per child in the child's ``ASYNCRL_STATUS_FILE`` and removes
it before each start. A child that takes part appends a line per fact::

    starting            it will say ``up`` once started: until then it is not
    up                  it has started (a worker: registered, its actor's on_start done)
    working             it did its first piece of work (a worker: a lease completed)
    failed <reason>     it is exiting on an error it can put in one line
    warn <line>         something a person must hear of while it runs (printed once)

A worker that exits with :data:`STOPS_THE_RUN` (after ``failed <reason>``) says that no
restart can help: the supervisor stops the run with its reason.

Only with these can the supervisor tell a worker that was killed after it came up (a crash,
``kill -9``: restart it) from one that never came up (the same failure on the next start),
however long either took: loading a large model before failing takes longer than any
fixed "healthy after". Nor is ``up`` the end of a start: a worker that comes up and then
fails in its own words at its first lease, before it ever said ``working``, fails there
on every start (a training group whose update breaks), and counts as failing to start.
A child that writes nothing is judged by how long it lived
(_start_failures.py). Without the variable (a process started by hand) these calls do
nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "STATUS_ENV",
    "STOPS_THE_RUN",
    "ChildStatus",
    "note_failure",
    "note_starting",
    "note_up",
    "note_warning",
    "note_working",
    "read_status",
]

STATUS_ENV = "ASYNCRL_STATUS_FILE"
_STARTING = "starting"
_UP = "up"
_WORKING = "working"
_FAILED = "failed "
_WARN = "warn "
STOPS_THE_RUN = 69  # a worker cannot go on, nor can the run (sysexits: EX_UNAVAILABLE)
_MAX_REASON = 400  # characters: a line for a terminal, not a traceback


@dataclass(frozen=True, slots=True)
class ChildStatus:
    starting: bool = False  # the child promised to say when it is up
    up: bool = False  # ... and did
    working: bool = False  # it did its first piece of work since it came up
    reason: str | None = None  # why it failed, as it said last
    warnings: tuple[str, ...] = ()  # what it asked to be told, in order

    @property
    def failed_at_first_work(self) -> bool:
        """It came up, then failed in its own words before it did any work: what the
        next start would meet again (a crash or a kill says no words)."""
        return self.up and not self.working and self.reason is not None

    @property
    def started_well(self) -> bool:
        """It came up and did not fail at its first work: a failure now is a crash or a
        kill of a running child, not one its next start would meet."""
        return self.up and not self.failed_at_first_work


def note_starting() -> None:
    """Tell the supervisor, if any, that this process will call :func:`note_up` once up."""
    _append(_STARTING)


def note_up() -> None:
    """Tell the supervisor, if any, that this process has started."""
    _append(_UP)


def note_working() -> None:
    """Tell the supervisor, if any, that this process did its first piece of work: a
    failure from now on is no longer one that its every start would meet."""
    _append(_WORKING)


def note_failure(reason: str) -> None:
    """Tell the supervisor, if any, why this process is about to exit."""
    _append(_FAILED + _one_line(reason))


def note_warning(text: str) -> None:
    """Ask the supervisor, if any, to put ``text`` on its terminal while this runs."""
    _append(_WARN + _one_line(text))


def _one_line(text: str) -> str:
    line = " ".join(text.split())  # one line, whatever the exception's text held
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


def read_status(path: Path) -> ChildStatus:
    """What the child wrote to ``path`` since its start; nothing if it wrote nothing."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return ChildStatus()
    reasons = [line.removeprefix(_FAILED) for line in lines if line.startswith(_FAILED)]
    warnings = tuple(line.removeprefix(_WARN) for line in lines if line.startswith(_WARN))
    reason = reasons[-1] if reasons else None
    return ChildStatus(_STARTING in lines, _UP in lines, _WORKING in lines, reason, warnings)


def _append(line: str) -> None:
    path = os.environ.get(STATUS_ENV)
    if not path:
        return
    try:
        # One short write in append mode: a reader never sees half a line.
        with open(path, "a", encoding="utf-8") as file:
            file.write(line + "\n")
    except OSError:
        pass  # a courtesy to the supervisor: failing to leave it must not change the exit
