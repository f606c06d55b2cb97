"""What the supervisor reports as it goes, and the one line `asyncrl run` prints for each.

Every event is `(kind, fields)`; the fields each kind carries:

- started: name, pid, restart (0 for the first start)
- exited: name, pid, lived_s, and code (a normal exit) or signal (e.g. "SIGTERM")
- restarting: name, delay_s, restart
- gave_up: name, restarts, max_restarts
- warning: name, text (what a running child asked to be told)
- stopping: reason
- killed: name, pid, why
- done: code
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Mapping
from enum import StrEnum

__all__ = ["EventKind", "describe", "how_it_ended", "print_event", "shell_status", "signal_name"]


class EventKind(StrEnum):
    STARTED = "started"
    EXITED = "exited"
    RESTARTING = "restarting"
    GAVE_UP = "gave_up"
    FAILING = "failing"
    WARNING = "warning"
    STOPPING = "stopping"
    KILLED = "killed"
    DONE = "done"


_TEMPLATES = {
    EventKind.STARTED: "started {name} (pid {pid})",
    EventKind.EXITED: "{name} (pid {pid}) exited with code {code}",
    EventKind.RESTARTING: "restarting {name} in {delay_s:g}s (restart {restart})",
    EventKind.GAVE_UP: "{name} exited again after {restarts} restarts "
    "(max_restarts={max_restarts}); giving up",
    EventKind.FAILING: "{name} failed the same way on {starts} starts in a row, so it is not "
    "started again: {reason}",
    EventKind.WARNING: "{name}: {text}",
    EventKind.STOPPING: "stopping: {reason}",
    EventKind.KILLED: "killed {name} (pid {pid}): {why}",
    EventKind.DONE: "done, exit code {code}",
}


def describe(kind: str, fields: Mapping[str, object]) -> str:
    """One short human line for an event."""
    if kind == EventKind.EXITED and "signal" in fields:
        return "{name} (pid {pid}) was ended by {signal}".format_map(fields)
    if kind == EventKind.STARTED and fields.get("restart"):
        return "started {name} (pid {pid}, restart {restart})".format_map(fields)
    line = _TEMPLATES[EventKind(kind)].format_map(fields)
    if kind == EventKind.EXITED and "why" in fields:
        line += f": {fields['why']}"  # what the child said of its failure
    return line


def print_event(kind: str, fields: Mapping[str, object]) -> None:
    """The default `on_event`: the line on stderr, prefixed like the command's other messages."""
    print(f"asyncrl run: {describe(kind, fields)}", file=sys.stderr, flush=True)


def how_it_ended(returncode: int) -> dict[str, object]:
    """An exited child's fields: its ``code``, or the ``signal`` that ended it."""
    if returncode < 0:
        return {"signal": signal_name(-returncode)}
    return {"code": returncode}


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def shell_status(returncode: int) -> int:
    """A child's `Popen.returncode` as a shell would report it: 128 + N for signal N."""
    return 128 - returncode if returncode < 0 else returncode
