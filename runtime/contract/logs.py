"""Logging for every asyncrl process: structlog and the standard library into one stream.

Entry points call `configure_logging` once, early; everything else only calls `get_logger`.
Both structlog calls and standard-library records (library warnings, `warnings.warn`) go through
one handler on the root logger, whose formatter adds the timestamp, level, process name and pid,
redacts secrets, and renders a JSON line or console text.

A process a supervisor started (asyncrl run, asyncrl node, a Ray actor) is told its log file in
its environment (`LOG_FILE_ENV`); that file is also its stdout and stderr. It is written by the
standard library's RotatingFileHandler, which moves it aside at `max_bytes` and keeps `keep` older
ones, so no process fills the disk; stdout and stderr follow each new file, so a traceback or a
library's own output lands where the log does. Log files are 0600 (or stricter, by the umask).

Everything that changes between calls lives in that handler's formatter, not in structlog's own
chain. The chain stays the same on every call, so cached loggers stay correct and configuring
again (as tests do) only swaps the handler.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["LOG_FILE_ENV", "configure_logging", "get_logger"]

LOG_FILE_ENV = "ASYNCRL_LOG_FILE"  # set by the supervisor that made this file our stdout/stderr

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_FORMATS = ("json", "console")
_HANDLER_NAME = "asyncrl"  # marks our handler, so configuring again replaces it
_LEAD_FIELDS = ("timestamp", "level", "event", "process", "pid")
_REDACTED = "[redacted]"
# Field names matched case-insensitively, "-" read as "_" (HTTP headers: X-Api-Key).
# Vocabulary fields (eos_token, pad_token) are no credentials: only these tokens are.
_SECRET_SUFFIXES = (
    *("secret", "secret_key", "password", "api_key", "apikey", "worker_key", "authorization"),
    *("access_token", "auth_token", "bearer_token", "refresh_token", "api_token"),
)
_SECRET_NAMES = frozenset({"curve_secretkey", "private_key", "token", "cookie"})
# A credential inside text (an error quoting a header): "Bearer <token>", the token long
# enough that prose ("bearer of news") is left alone.
_BEARER = re.compile(r"(?i)\b(bearer)\s+[\w.~+/=-]{16,}")


def configure_logging(
    *,
    process: str,
    level: str = "info",
    fmt: str = "json",
    file: Path | None = None,
    max_bytes: int = 32 << 20,
    keep: int = 3,
) -> None:
    """Send this process's logs, tagged with `process` (e.g. "generate-0"), to `file`, else to
    the file its supervisor named (`LOG_FILE_ENV`), else to stderr. A file is rotated at
    `max_bytes`, `keep` older ones kept.

    `fmt` is "json" (one object per line) or "console" (human-readable). Safe to call again: the
    previous handler is removed and its file closed.
    """
    if level not in _LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_LEVELS)}")
    if fmt not in _FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(_FORMATS)}")
    if file is None and os.environ.get(LOG_FILE_ENV):
        file = Path(os.environ[LOG_FILE_ENV])
    handler = _open_handler(file, max_bytes, keep)
    handler.set_name(_HANDLER_NAME)
    colors = fmt == "console" and file is None and sys.stderr.isatty()
    handler.setFormatter(_formatter(process, fmt, colors=colors))

    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(_LEVELS[level])
    logging.captureWarnings(True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.filter_by_level,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def get_logger(name: str | None = None) -> structlog.stdlib.BoundLogger:
    """A structlog logger; `name` (usually `__name__`) becomes the line's "logger" field."""
    return structlog.stdlib.get_logger(name)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time, so a replaced stderr (pytest) is used."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr


class _RotatingLog(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler whose files are private and, where the file is also this
    process's stdout and stderr, which moves those to each new file."""

    def __init__(self, file: Path, max_bytes: int, keep: int) -> None:
        super().__init__(file, maxBytes=max_bytes, backupCount=keep, encoding="utf-8")
        self._stdio = [fd for fd in (1, 2) if _same_file(fd, file)]
        self._pid = os.getpid()

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        # A forked child (a journal snapshot's, say) writes on but never rotates: two
        # processes renaming one file would each keep writing to a file moved aside.
        return os.getpid() == self._pid and bool(super().shouldRollover(record))

    def _open(self) -> TextIO:
        # The standard library's hook, so the file is made 0600 rather than by the umask.
        return open(
            self.baseFilename,
            self.mode,
            encoding=self.encoding,
            errors=self.errors,
            opener=_private_opener,
        )

    def doRollover(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        super().doRollover()
        if self.stream is not None:
            for fd in self._stdio:
                os.dup2(self.stream.fileno(), fd)


def _private_opener(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def _same_file(fd: int, file: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(file))
    except OSError:
        return False


def _open_handler(file: Path | None, max_bytes: int, keep: int) -> logging.Handler:
    if file is None:
        return _StderrHandler()
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Flushed after every record: a crash loses no line and `tail -f` sees each one.
    return _RotatingLog(file, max_bytes, keep)


def _formatter(process: str, fmt: str, *, colors: bool) -> logging.Formatter:
    def add_process(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
        event_dict["process"] = process
        event_dict["pid"] = os.getpid()  # read per line: still right in a forked child
        # The fields every line has come first, so lines read alike whatever else they carry.
        lead = {key: event_dict.pop(key) for key in _LEAD_FIELDS if key in event_dict}
        return {**lead, **event_dict}

    renderer: list[Processor]
    if fmt == "json":
        renderer = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        renderer = [structlog.dev.ConsoleRenderer(colors=colors)]
    return structlog.stdlib.ProcessorFormatter(
        # Runs only for standard-library records: carries their `extra=` fields over.
        foreign_pre_chain=[structlog.stdlib.ExtraAdder()],
        processors=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_process,
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _redact_secrets,
            *renderer,
        ],
    )


def _redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Replace the value of every secret-named field, nested mappings included."""
    return _redact(event_dict)


def _redact(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    return {key: _redacted_value(key, value) for key, value in mapping.items()}


def _redacted_value(key: object, value: Any) -> Any:
    if _is_secret(key):
        return _REDACTED
    return _without_secrets(value)


def _without_secrets(value: Any) -> Any:
    if isinstance(value, Mapping):
        return _redact(value)
    if isinstance(value, list | tuple):
        return [_without_secrets(item) for item in value]
    if isinstance(value, str):
        return _BEARER.sub(rf"\1 {_REDACTED}", value)
    return value


def _is_secret(key: object) -> bool:
    name = str(key).lower().replace("-", "_")
    return name in _SECRET_NAMES or name.endswith(_SECRET_SUFFIXES)
