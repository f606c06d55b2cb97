"""Per-class code generated from the protocol's annotations: builders and field lists.

Builders: the checks of _typed.py, generated as one flat function per class.

:func:`_typed.build` walks a list of per-field check closures, with a ``try`` per field
to name the field on failure: about a dozen Python calls for a three-field request, on
every message the scheduler reads. :func:`register` also generates, from the same
annotations, one function per class that checks every field inline (``type(v) is int``
and the like) and builds the instance. It knows only *that* a message is invalid, not
where: on any failure :func:`build` runs the field-by-field path of _typed.py again, which
decides (a body with defaulted fields left out is valid there) and names the problem. So
what is accepted, and every error's wording, stay exactly those of _typed.py.

Field lists (:func:`to_wire`): a message's fields in declaration order, nested messages as
lists too. Which fields can hold a nested message is known from the annotations, so only
those are looked at; the others go to the packer as they are.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from . import _typed
from ._typed import MAX_DEPTH, Invalid

__all__ = ["build", "register", "to_wire"]


class _Miss(Invalid):
    """The compiled check failed somewhere; the careful path says where."""

    def __init__(self) -> None:
        super().__init__("invalid")


_FAST: dict[type, Callable[[Any, int], Any]] = {}
_WIRE: dict[type, Callable[[Any], list[Any]]] = {}
_SCALARS = (int, str, bool, bytes)


def build(cls: type, body: Any, depth: int = 0) -> Any:
    """``cls`` built from a decoded body, every field checked; Invalid names what was wrong."""
    try:
        return _FAST[cls](body, depth)
    except Invalid:
        pass
    return _typed.build(cls, body, depth)


def register(cls: type, namespace: dict[str, Any]) -> None:
    """Prepare both paths for dataclass ``cls``; classes it nests must be registered first."""
    _typed.register(cls, namespace)
    hints = typing.get_type_hints(cls, globalns=namespace)
    fields = dataclasses.fields(cls)
    _FAST[cls] = _Compiler(cls).function([hints[f.name] for f in fields])
    _WIRE[cls] = _lister(cls, [(f.name, _may_nest(hints[f.name])) for f in fields])


def to_wire(message: Any) -> list[Any]:
    """The fields of a registered ``message`` as MessagePack-ready values, in order."""
    return _WIRE[type(message)](message)


def _nested(value: Any) -> Any:
    """A field that may hold a message, or a tuple of them, as lists (else as it is)."""
    lister = _WIRE.get(type(value))
    if lister is not None:
        return lister(value)
    if isinstance(value, tuple) and value and type(value[0]) in _WIRE:
        return [to_wire(v) for v in value]
    return value


def _may_nest(hint: Any) -> bool:
    if dataclasses.is_dataclass(hint):
        return True
    return any(_may_nest(arg) for arg in typing.get_args(hint) if arg is not Ellipsis)


def _lister(cls: type, fields: list[tuple[str, bool]]) -> Callable[[Any], list[Any]]:
    parts = [f"_nested(m.{name})" if nests else f"m.{name}" for name, nests in fields]
    source = f"def to_wire(m):\n    return [{', '.join(parts)}]"
    env: dict[str, Any] = {"_nested": _nested}
    exec(compile(source, f"<fields of {cls.__name__}>", "exec"), env)
    return env["to_wire"]


class _Compiler:
    """Writes the source of one class's builder; ``env`` holds the names it refers to."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.env: dict[str, Any] = {
            "_cls": cls,
            "_Miss": _Miss,
            "_isfinite": math.isfinite,
            "_check_depth": _typed._check_depth,
            "MAX_DEPTH": MAX_DEPTH,
            "int": int,
            "str": str,
            "bool": bool,
            "bytes": bytes,
            "float": float,
            "list": list,
            "dict": dict,
            "tuple": tuple,
        }
        self.lines: list[str] = []

    def function(self, hints: list[Any]) -> Callable[[Any, int], Any]:
        names = [f"v{i}" for i in range(len(hints))]
        emit = self.lines.append
        emit("def build(body, depth):")
        emit(f"    if type(body) is not list or len(body) != {len(names)}:")
        emit("        raise _Miss")
        if names:
            emit(f"    {', '.join(names)}, = body")
        emit("    d = depth + 1")
        for name, hint in zip(names, hints, strict=True):
            self._check(hint, name, "d", 1)
        emit(f"    return _cls({', '.join(names)})")
        source = "\n".join(self.lines)
        exec(compile(source, f"<builder of {self.cls.__name__}>", "exec"), self.env)
        return self.env["build"]

    def _check(self, hint: Any, var: str, depth: str, indent: int) -> None:
        """Code that checks ``var`` against ``hint`` and rebinds it to the converted value,
        in the same order and at the same nesting depth as _typed.py's checks."""
        pad = "    " * indent
        emit = self.lines.append
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (types.UnionType, typing.Union):
            inner = next(a for a in args if a is not type(None))
            emit(f"{pad}if {var} is not None:")
            self._check(inner, var, depth, indent + 1)
        elif hint in _SCALARS:
            emit(f"{pad}if type({var}) is not {hint.__name__}:")
            emit(f"{pad}    raise _Miss")
        elif hint is float:
            emit(f"{pad}if type({var}) is int:")
            emit(f"{pad}    {var} = float({var})")
            emit(f"{pad}elif type({var}) is not float or not _isfinite({var}):")
            emit(f"{pad}    raise _Miss")
        elif dataclasses.is_dataclass(hint):
            builder = self._name(f"_build_{hint.__name__}", _FAST[hint])
            emit(f"{pad}{var} = {builder}({var}, {depth})")
        elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            self._many(args[0], var, depth, pad)
        elif origin is tuple and all(a in _SCALARS for a in args):
            parts = [f"{var}_{i}" for i in range(len(args))]
            emit(f"{pad}if type({var}) is not list or len({var}) != {len(args)}:")
            emit(f"{pad}    raise _Miss")
            emit(f"{pad}{', '.join(parts)}, = {var}")
            for part, arg in zip(parts, args, strict=True):
                self._check(arg, part, depth, indent)
            emit(f"{pad}{var} = ({', '.join(parts)},)")
        elif origin is dict and args[1] is Any:
            key, value = f"{var}_k", f"{var}_v"
            emit(f"{pad}if type({var}) is not dict:")
            emit(f"{pad}    raise _Miss")
            emit(f"{pad}if {var} and {depth} > MAX_DEPTH:")
            emit(f"{pad}    raise _Miss")
            emit(f"{pad}for {key}, {value} in {var}.items():")
            emit(f"{pad}    if type({key}) is not str:")
            emit(f"{pad}        raise _Miss")
            emit(f"{pad}    if type({value}) is list or type({value}) is dict:")
            emit(f"{pad}        _check_depth({value}, {depth})")
        elif origin is dict:
            key, value, out = f"{var}_k", f"{var}_v", f"{var}_out"
            emit(f"{pad}if type({var}) is not dict:")
            emit(f"{pad}    raise _Miss")
            emit(f"{pad}{out} = {{}}")
            emit(f"{pad}for {key}, {value} in {var}.items():")
            emit(f"{pad}    if type({key}) is not str:")
            emit(f"{pad}        raise _Miss")
            self._check(args[1], value, depth, indent + 1)
            emit(f"{pad}    {out}[{key}] = {value}")
            emit(f"{pad}{var} = {out}")
        else:  # rare shapes: the careful check itself (its errors also fall back)
            check = self._name(f"_check_{var}", _typed._checker(hint))
            emit(f"{pad}{var} = {check}({var}, {depth})")

    def _many(self, item: Any, var: str, depth: str, pad: str) -> None:
        emit = self.lines.append
        emit(f"{pad}if type({var}) is not list:")
        emit(f"{pad}    raise _Miss")
        if item in _SCALARS:
            emit(f"{pad}for x in {var}:")
            emit(f"{pad}    if type(x) is not {item.__name__}:")
            emit(f"{pad}        raise _Miss")
            emit(f"{pad}{var} = tuple({var})")
        elif dataclasses.is_dataclass(item):
            builder = self._name(f"_build_{item.__name__}", _FAST[item])
            emit(f"{pad}{var} = tuple([{builder}(x, {depth}) for x in {var}])")
        else:
            check = self._name(f"_item_{var}", _typed._checker(item))
            emit(f"{pad}{var} = tuple([{check}(x, {depth}) for x in {var}])")

    def _name(self, name: str, value: Any) -> str:
        self.env[name] = value
        return name
