"""Logging for every asyncrl process: structlog and the standard library into one stream.

Entry points call `configure_logging` once, early; everything else only calls `get_logger`.
Both structlog calls and standard-library records (library warnings, `warnings.warn`) go through
one handler on the root logger, whose formatter adds the timestamp, level, process name and pid,
redacts secrets, and renders a JSON line or console text.

Everything that changes between calls lives in that handler's formatter, not in structlog's own
chain. The chain stays the same on every call, so cached loggers stay correct and configuring
again (as tests do) only swaps the handler.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["configure_logging", "get_logger"]

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
    *, process: str, level: str = "info", fmt: str = "json", file: Path | None = None
) -> None:
    """Send this process's logs, tagged with `process` (e.g. "generate-0"), to `file` or stderr.

    `fmt` is "json" (one object per line) or "console" (human-readable). Safe to call again: the
    previous handler is removed and its file closed.
    """
    if level not in _LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_LEVELS)}")
    if fmt not in _FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(_FORMATS)}")
    handler = _open_handler(file)
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


def _open_handler(file: Path | None) -> logging.Handler:
    if file is None:
        return _StderrHandler()
    file.parent.mkdir(parents=True, exist_ok=True)
    # FileHandler flushes after every record: a crash loses no line and `tail -f` sees each one.
    return logging.FileHandler(file, mode="a", encoding="utf-8")


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
