"""The compiled builders accept exactly what the field-by-field checks accept, and fail alike."""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.transport import _compiled, _typed, messages
from asyncrl.transport import protocol as p

CLASSES = [p.Result, p.Item, p.NewGroup, *typing.get_args(p.Message)]

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)


def nested(depth: int) -> st.SearchStrategy[Any]:
    """Lists and maps nested ``depth`` deep: the payload depth bound is checked too."""
    value: st.SearchStrategy[Any] = st.integers()
    for _ in range(depth):
        value = st.lists(value, min_size=1, max_size=1) | st.dictionaries(
            st.just("k"), value, min_size=1
        )
    return value


@functools.cache
def wire_values(hint: Any) -> st.SearchStrategy[Any]:
    """Mostly values of the right shape for ``hint``, sometimes anything at all."""
    right = _right(hint)
    return st.integers(0, 9).flatmap(lambda i: plain if i == 0 else right)


def _right(hint: Any) -> st.SearchStrategy[Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return st.none() | wire_values(next(a for a in args if a is not type(None)))
    if hint is int:
        return st.integers(-(2**63), 2**63 - 1)
    if hint is float:
        special = st.sampled_from([math.nan, math.inf, -math.inf, -0.0])
        return special | st.floats() | st.integers(-(2**53), 2**53)
    if hint is str:
        return st.text(max_size=5)
    if hint is bool:
        return st.booleans()
    if hint is bytes:
        return st.binary(max_size=5)
    if dataclasses.is_dataclass(hint):
        return bodies(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(wire_values(args[0]), max_size=3)
    if origin is tuple:
        return st.tuples(*(wire_values(a) for a in args)).map(list)
    if origin is dict:
        inner = plain | nested(14) | nested(18) if args[1] is Any else wire_values(args[1])
        return st.dictionaries(st.text(max_size=3), inner, max_size=3)
    raise TypeError(hint)


@functools.cache
def bodies(cls: type) -> st.SearchStrategy[list[Any]]:
    hints = typing.get_type_hints(cls, globalns=vars(messages))
    fields = [wire_values(hints[f.name]) for f in dataclasses.fields(cls)]
    full = st.tuples(*fields).map(list)
    cut = full.flatmap(lambda body: st.integers(0, len(body)).map(lambda n: body[:n]))
    return st.integers(0, 3).flatmap(lambda i: cut if i == 0 else full)


def outcome(build: Any, cls: type, body: Any) -> str:
    try:
        return repr(build(cls, body, 0))
    except _typed.Invalid as bad:
        return "Invalid: " + bad.describe(cls.__name__)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_compiled_and_careful_builders_agree(cls: type, data: st.DataObject) -> None:
    body = data.draw(st.integers(0, 4).flatmap(lambda i: plain if i == 0 else bodies(cls)))
    assert outcome(_compiled.build, cls, body) == outcome(_typed.build, cls, body)


def test_a_valid_message_takes_the_compiled_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def careful(*_args: Any) -> Any:
        raise AssertionError("the careful path ran for a valid message")

    monkeypatch.setattr(_typed, "build", careful)
    result = p.Result(3, {"t": [1, [2, {"x": 1.5}]]}, (0, 1))
    message = p.Complete("w", 1, 2, (result,), None)
    assert p.decode(p.encode(message, 7)) == message
