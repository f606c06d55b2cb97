"""Why a child process ended, as its log's last line says: for a person, on the terminal.

Workers log JSON lines (the error of a failed start is a field of the last one); a
command that refused its arguments writes one plain line; a crash ends in a traceback
whose last line names the exception. Any of these, made one readable line.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["last_words"]

_TAIL_BYTES = 16 * 1024
_MAX_CHARS = 400


def last_words(log: Path, since: int = 0) -> str:
    """The last non-empty line of ``log`` written past byte ``since`` (where this start's
    output began: an earlier start's words are not this one's), a JSON record as
    ``event: error``; "" if none."""
    try:
        with log.open("rb") as handle:
            end = handle.seek(0, 2)
            if since > end:  # the log was rotated since: all of this file is this start's
                since = 0
            handle.seek(max(since, end - _TAIL_BYTES))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if line:
            return _readable(line)[:_MAX_CHARS]
    return ""


def _readable(line: str) -> str:
    try:
        record = json.loads(line)
    except ValueError:
        return line
    if not isinstance(record, dict):
        return line
    event, error = record.get("event", ""), record.get("error") or record.get("reason")
    return f"{event}: {error}" if error else str(event or line)
