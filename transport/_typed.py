"""Building a frozen dataclass from decoded MessagePack, checking every field's annotation.

The protocol declares its messages as annotated dataclasses; :func:`register` turns each
annotation into a check once, and :func:`build` applies them to a decoded body (a list of
fields in declaration order). Supported annotations: int, float (finite; an int is
accepted), str, bool, optional ``X | None``, ``tuple[X, ...]``, fixed tuples,
``dict[str, X]``, ``dict[str, Any]`` (plain data nested at most :data:`MAX_DEPTH` deep) and
other registered dataclasses. A failure is :class:`Invalid`, whose path names the field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_DEPTH", "Invalid", "build", "register"]

MAX_DEPTH = 16  # nesting of payload values; deeper is refused, not recursed into


class Invalid(Exception):
    """A field that does not check out. Its path is gathered while the error unwinds, so a
    valid message never pays for formatting the names of its fields."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self._path: list[str] = []  # innermost first

    def at(self, part: str) -> Invalid:
        self._path.append(part)
        return self

    def describe(self, root: str) -> str:
        return f"{root}{''.join(reversed(self._path))}: {self.detail}"


def build(cls: type, body: Any, depth: int) -> Any:
    checks, required = _CHECKS[cls]
    if not isinstance(body, list):
        raise Invalid("body must be a list of fields")
    if not required <= len(body) <= len(checks):
        raise Invalid(f"{len(body)} fields, expected {required}..{len(checks)}")
    values = []
    for (name, check), raw in zip(checks, body, strict=False):
        try:
            values.append(check(raw, depth + 1))
        except Invalid as bad:
            raise bad.at(f".{name}") from None
    return cls(*values)


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


Check = Callable[[Any, int], Any]
"""Validates and converts one decoded value (at a nesting depth); raises Invalid."""


def _checker(hint: Any) -> Check:
    """A function that validates and converts one decoded field of type ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in args if a is not type(None)]
        inner = _checker(options[0])

        def optional(raw: Any, depth: int) -> Any:
            return None if raw is None else inner(raw, depth)

        return optional
    if hint in _SCALARS:
        return _SCALARS[hint]
    if dataclasses.is_dataclass(hint):
        return lambda raw, depth: build(hint, raw, depth)
    if origin is tuple:
        return _tuple_checker(args)
    if origin is dict:
        return _dict_checker(args[1])
    raise TypeError(f"no wire check for {hint!r}")


def _wrong_type(kind: type, raw: Any) -> Invalid:
    return Invalid(f"expected {kind.__name__}, got {type(raw).__name__}")


def _check_int(raw: Any, _depth: int) -> int:
    if type(raw) is not int:
        raise _wrong_type(int, raw)
    return raw


def _check_str(raw: Any, _depth: int) -> str:
    if type(raw) is not str:
        raise _wrong_type(str, raw)
    return raw


def _check_bool(raw: Any, _depth: int) -> bool:
    if type(raw) is not bool:
        raise _wrong_type(bool, raw)
    return raw


def _check_float(raw: Any, _depth: int) -> float:
    if type(raw) is int:
        return float(raw)
    if type(raw) is not float:
        raise _wrong_type(float, raw)
    if not math.isfinite(raw):
        raise Invalid(f"{raw} is not a finite number")
    return raw


def _check_bytes(raw: Any, _depth: int) -> bytes:
    if type(raw) is not bytes:
        raise _wrong_type(bytes, raw)
    return raw


_SCALARS: dict[type, Check] = {
    int: _check_int,
    str: _check_str,
    bool: _check_bool,
    float: _check_float,
    bytes: _check_bytes,  # opaque addresses (a weight-plane endpoint), MessagePack bin
}


def _tuple_checker(args: tuple[Any, ...]) -> Check:
    variadic = len(args) == 2 and args[1] is Ellipsis
    items = [_checker(args[0])] if variadic else [_checker(a) for a in args]

    def check(raw: Any, depth: int) -> Any:
        if not isinstance(raw, list):
            raise Invalid(f"expected a list, got {type(raw).__name__}")
        if not variadic and len(raw) != len(items):
            raise Invalid(f"expected {len(items)} values, got {len(raw)}")
        out = []
        for i, (c, v) in enumerate(zip(items * len(raw) if variadic else items, raw, strict=True)):
            try:
                out.append(c(v, depth))
            except Invalid as bad:
                raise bad.at(f"[{i}]") from None
        return tuple(out)

    return check


def _dict_checker(value_hint: Any) -> Check:
    inner = None if value_hint is Any else _checker(value_hint)

    def check(raw: Any, depth: int) -> Any:
        if not isinstance(raw, dict) or not all(type(k) is str for k in raw):
            raise Invalid("expected a map with string keys")
        if inner is None:
            for v in raw.values():
                _check_depth(v, depth)
            return raw
        out = {}
        for k, v in raw.items():
            try:
                out[k] = inner(v, depth)
            except Invalid as bad:
                raise bad.at(f"[{k!r:.40}]") from None
        return out

    return check


def _check_depth(raw: Any, depth: int) -> None:
    """Payload values are plain MessagePack data and arrays, nested to a bounded depth."""
    if depth > MAX_DEPTH:
        raise Invalid(f"nested deeper than {MAX_DEPTH}")
    if isinstance(raw, list):
        for v in raw:
            _check_depth(v, depth + 1)
    elif isinstance(raw, dict):
        for v in raw.values():
            _check_depth(v, depth + 1)


_CHECKS: dict[type, tuple[list[tuple[str, Check]], int]] = {}  # per class: checks, required


def register(cls: type, namespace: dict[str, Any]) -> None:
    """Prepare the checks of dataclass ``cls`` (its annotations resolved in ``namespace``)."""
    hints = typing.get_type_hints(cls, globalns=namespace)
    fields = dataclasses.fields(cls)
    checks = [(f.name, _checker(hints[f.name])) for f in fields]
    _CHECKS[cls] = (checks, sum(1 for f in fields if _required(f)))
