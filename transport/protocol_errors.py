"""Frames that are not a valid message: :class:`ProtocolError`, and words for what was
wrong that name the message and, where the decoder says where, the field."""

from __future__ import annotations

import re
import types
import typing
from typing import Any

import msgpack
import msgspec

__all__ = ["ProtocolError", "bad_utf8_at", "is_bad_utf8", "what_is_wrong"]


class ProtocolError(ValueError):
    """Frames that are not a valid message of this protocol version; says what was wrong."""

    def __init__(self, detail: str, req_id: int = 0) -> None:
        super().__init__(detail)
        self.req_id = req_id


def what_is_wrong(cls: type, body: Any, error: Exception) -> str:
    """What the ``error`` that decoding ``body`` as a ``cls`` raised says, naming the
    message and, where msgspec says where, its field."""
    if isinstance(error, msgspec.ValidationError):
        return _describe(cls, str(error))
    if is_bad_utf8(error):  # msgspec says neither where nor in what
        return _describe(cls, f"Invalid UTF-8 - at `{bad_utf8_at(body)}`")
    if isinstance(error, ProtocolError):  # an array reference, or an array frame unused
        return f"{cls.__name__}: {error}"
    if isinstance(error, msgspec.DecodeError | RecursionError):
        return f"{cls.__name__}: body is not MessagePack: {error}"
    # Not foreseen: msgspec or numpy refusing hostile input in a way of their own.
    return f"{cls.__name__}: body does not decode: {type(error).__name__}: {error}"


def is_bad_utf8(error: Exception) -> bool:
    """Whether decoding failed on a string that is not UTF-8: msgspec before 0.23 raises
    UnicodeDecodeError for it, from 0.23 on a DecodeError that says so."""
    if isinstance(error, UnicodeDecodeError):
        return True
    return isinstance(error, msgspec.DecodeError) and "UTF-8" in str(error)


def bad_utf8_at(packed: Any) -> str:
    """msgspec's path (``$[0]``, ``key` in `$[2]``) to the first str in ``packed`` that
    is not UTF-8, found by unpacking it again with bad bytes kept as lone surrogates;
    ``$`` where that unpacking fails too."""
    try:
        value = msgpack.unpackb(
            packed,
            unicode_errors="surrogateescape",
            strict_map_key=False,
            ext_hook=lambda _code, _data: None,
        )
    except Exception:
        return "$"
    walk: list[tuple[Any, str, bool]] = [(value, "$", False)]  # value, path, is a map key
    while walk:  # depth first, in the order msgspec reads, without recursion
        value, path, is_key = walk.pop()
        if isinstance(value, str) and not value.isascii() and not _utf8(value):
            return f"key` in `{path}" if is_key else path
        if isinstance(value, list):
            walk.extend((v, f"{path}[{i}]", False) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, dict):
            for key, item in reversed(value.items()):
                walk += [(item, f"{path}[...]", False), (key, path, True)]
    return "$"


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: bytes that were not UTF-8
        return False
    return True


_PATH = re.compile(r"\[(\d+|\.\.\.)\]")
_AT = re.compile(r"^(?P<what>.*?) - at `(?P<key>key` in `)?(?P<path>\$[^`]*)`$")


def _describe(cls: type, error: str) -> str:
    """msgspec's ``Expected int, got str - at $[2]`` as ``Claim.n: expected int, got str``."""
    match = _AT.match(error)
    if match is None:  # about the whole body: its length, or a check of __post_init__
        if error.startswith(cls.__name__):
            return error
        return f"{cls.__name__}: {_plain(error)}"
    what = _plain(match["what"])
    where = _field_path(cls, match["path"])
    return f"{where}: map key: {what}" if match["key"] else f"{where}: {what}"


def _plain(text: str) -> str:
    text = text.replace("`", "")
    return text[:1].lower() + text[1:]


def _field_path(cls: type, path: str) -> str:
    named, hint = cls.__name__, cls
    for step in _PATH.findall(path):
        hint = _unwrap(hint)
        if isinstance(hint, type) and issubclass(hint, msgspec.Struct) and step != "...":
            field = msgspec.structs.fields(hint)[int(step)]
            named, hint = f"{named}.{field.name}", field.type
        elif typing.get_origin(hint) in (tuple, list) and step != "...":
            named, hint = f"{named}[{step}]", typing.get_args(hint)[0]
        elif typing.get_origin(hint) is dict:
            named, hint = f"{named}[...]", typing.get_args(hint)[1]
        else:
            named, hint = f"{named}[{step}]", Any
    return named


def _unwrap(hint: Any) -> Any:
    """``X | None`` as X."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return options[0] if len(options) == 1 else hint
    return hint
