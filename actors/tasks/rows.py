"""Rows of data files in verl's layout, read with ``datasets`` and checked one by one.

A row is a JSON object (a line of a ``.jsonl`` file, or a row of a ``.parquet`` file)::

    {"prompt": [{"role": "user", "content": "4589+123="}],   # chat messages, at least one
     "reward_model": {"ground_truth": "4712"},              # a string or a number
     "data_source": "addition",                             # a string
     "extra_info": {...}}                                   # optional: a mapping or null

Other keys (verl's ``ability``, ``reward_model.style``) are allowed and ignored. Every
row is checked when the files are read; the first bad one is a :class:`DataFileError`
naming the file, the row (counted from 0, as ``datasets`` and pandas count them) and
the field.
"""

from __future__ import annotations

import numbers
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DataFileError", "Row", "read_files", "read_rows"]

# Suffix → the datasets builder that reads it.
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataFileError(ValueError):
    """A data file that is missing, unreadable, or holds a bad row; one line naming it."""


@dataclass(frozen=True, slots=True)
class Row:
    """One checked row: the chat messages, and what the reward compares against."""

    where: str  # "FILE row N", for errors found after reading (a prompt too long)
    messages: tuple[Mapping[str, Any], ...]  # each with a role and a content string
    ground_truth: str
    data_source: str
    extra_info: Mapping[str, Any] | None = None


def read_rows(paths: Sequence[str], key: str) -> list[Row]:
    """Every row of ``paths`` (the config ``key`` that named them), in file order."""
    return [row for rows in read_files(paths, key) for row in rows]


def read_files(paths: Sequence[str], key: str) -> list[list[Row]]:
    """The rows of each of ``paths``, file by file (a file may hold none, not all may)."""
    if not paths:
        raise DataFileError(f"{key}: no files given")
    files = [_read_file(Path(path).expanduser(), key) for path in paths]
    if not any(files):
        raise DataFileError(f"{key}: the files hold no rows")
    return files


def _read_file(path: Path, key: str) -> list[Row]:
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        known = ", ".join(_FORMATS)
        raise DataFileError(f"{key}: {path}: unknown file type (expected {known})")
    if not path.is_file():
        raise DataFileError(f"{key}: {path}: no such file")
    if path.stat().st_size == 0:
        return []  # no rows, rather than the JSON reader's bare StopIteration
    return [_row(record, path, number) for number, record in enumerate(_records(path, fmt))]


def _records(path: Path, fmt: str) -> Iterable[dict[str, Any]]:
    import datasets  # a second to import: only runs that read data files pay it

    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()
    # Read into memory through a cache of our own: the shared one in the home directory
    # would grow with every file a run ever read, and processes would contend for it.
    with tempfile.TemporaryDirectory(prefix="asyncrl-data-") as cache:
        try:
            return datasets.load_dataset(
                fmt, data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True
            )
        except Exception as error:
            raise DataFileError(f"{path}: cannot be read as {fmt}: {_root(error)}") from None


def _root(error: BaseException) -> str:
    """The innermost cause's message, on one line: what the reader tripped on."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return " ".join(f"{type(error).__name__}: {error}".split())


def _row(record: Mapping[str, Any], path: Path, number: int) -> Row:
    where = f"{path} row {number}"
    return Row(
        where=where,
        messages=_messages(record.get("prompt"), where),
        ground_truth=_ground_truth(record.get("reward_model"), where),
        data_source=_string(record.get("data_source"), f"{where}: data_source"),
        extra_info=_extra_info(record.get("extra_info"), where),
    )


def _messages(value: Any, where: str) -> tuple[Mapping[str, Any], ...]:
    if value is None:
        raise DataFileError(f"{where}: prompt is missing")
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise DataFileError(
            f"{where}: prompt is {_kind(value)}, not a list of chat messages "
            "({role, content} mappings)"
        )
    if not value:
        raise DataFileError(f"{where}: prompt is empty (no messages)")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise DataFileError(f"{where}: prompt[{i}] is {_kind(message)}, not a mapping")
        _string(message.get("role"), f"{where}: prompt[{i}].role", empty_ok=False)
        _string(message.get("content"), f"{where}: prompt[{i}].content")
        messages.append(dict(message))
    if not any(m["content"].strip() for m in messages):
        raise DataFileError(f"{where}: prompt is empty (its messages hold no text)")
    return tuple(messages)


def _ground_truth(value: Any, where: str) -> str:
    if value is None:
        raise DataFileError(f"{where}: reward_model is missing")
    if not isinstance(value, Mapping):
        raise DataFileError(f"{where}: reward_model is {_kind(value)}, not a mapping")
    truth = value.get("ground_truth")
    if truth is None:
        raise DataFileError(f"{where}: reward_model.ground_truth is missing")
    if isinstance(truth, numbers.Real) and not isinstance(truth, bool):
        return str(truth)  # JSON lines may hold a number; the verifiers compare text
    return _string(truth, f"{where}: reward_model.ground_truth", empty_ok=False)


def _extra_info(value: Any, where: str) -> Mapping[str, Any] | None:
    if value is not None and not isinstance(value, Mapping):
        raise DataFileError(f"{where}: extra_info is {_kind(value)}, not a mapping")
    return value


def _string(value: Any, where: str, *, empty_ok: bool = True) -> str:
    if value is None:
        raise DataFileError(f"{where} is missing")
    if not isinstance(value, str):
        raise DataFileError(f"{where} is {_kind(value)}, not a string")
    if not empty_ok and not value.strip():
        raise DataFileError(f"{where} is empty")
    return value


def _kind(value: Any) -> str:
    return "a list" if isinstance(value, list) else f"{type(value).__name__} {value!r:.40}"
