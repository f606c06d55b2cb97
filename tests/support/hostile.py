"""Hostile MessagePack for every field of every message: what a broken or malicious peer sends.

A body is built valid (a value of the declared type for each field), then one field's
encoded value is swapped for hostile bytes: a wrong type, a str that is not UTF-8, an
integer at a 64-bit edge, a float that is not finite, ten thousand nested arrays, an
unknown extension, an array reference that lies. msgpack cannot write most of these
(invalid UTF-8, extensions in a str's place), so the field is packed as a marker string
and the marker's bytes are replaced.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgpack
import msgspec
from hypothesis import strategies as st

from asyncrl.transport import protocol as p

__all__ = [
    "ARRAY_FRAME",
    "BAD_UTF8",
    "HOSTILE",
    "KEY",
    "MESSAGES",
    "decodes",
    "fields",
    "frames",
    "hostile_bytes",
    "packed",
    "takes_text",
]

MESSAGES: tuple[type, ...] = typing.get_args(p.Message)
KEY = "<key>"  # a path step: the key "k" of a map made here, not the value under it
_MARK = "\x00hostile\x00"
_PACKED_MARK = msgpack.packb(_MARK)
ARRAY_FRAME = b"\0" * 4  # the frame a reference to one int32 (or 4 int8) rightly names

BAD_UTF8 = b"\xa5ab\xb4cd"  # fixstr of 5 bytes; 0xb4 starts no UTF-8 sequence


def _ext(code: int, data: bytes) -> bytes:
    """An extension (ext 8) of ``code``: negative codes too, which msgpack will not write."""
    return b"\xc7" + bytes([len(data)]) + code.to_bytes(1, "big", signed=True) + data


def _ref(*fields: object) -> bytes:
    """An array reference (extension 1) holding ``fields`` rather than [frame, dtype, shape]."""
    return _ext(1, msgpack.packb(list(fields)))


HOSTILE: tuple[bytes, ...] = (
    # wrong types
    *(msgpack.packb(v) for v in (None, True, 0, -1, 1.5, "x", b"x", [], [1], {}, {"k": 1})),
    # integers at the 64-bit edges (MessagePack has nothing wider)
    *(msgpack.packb(v) for v in (2**64 - 1, 2**63, 2**63 - 1, -(2**63), -(2**31) - 1)),
    # floats that are not finite, in both widths
    *(msgpack.packb(v) for v in (math.nan, math.inf, -math.inf, -0.0)),
    b"\xca\x7f\xc0\x00\x00",
    b"\xca\xff\x80\x00\x00",
    # strs that are not UTF-8: a stray byte, an encoded surrogate, past U+10FFFF, cut short
    BAD_UTF8,
    b"\xd9\x03\xed\xa0\x80",
    b"\xa4\xf4\x90\x80\x80",
    b"\xa2a\xe2",
    b"\xa1\xff",
    # lengths that lie, and the byte MessagePack never uses
    b"\xa5ab",
    b"\xdb\xff\xff\xff\xff",
    b"\xdd\xff\xff\xff\xff",
    b"\xdf\xff\xff\xff\xff",
    b"\xc6\xff\xff\xff\xff",
    b"\xc1",
    # deep nesting: about as deep as Python's own recursion limit, and far past it
    b"\x91" * 1_000 + b"\xc0",
    b"\x91" * 10_000 + b"\xc0",
    b"\x81\xa1k" * 5_000 + b"\xc0",
    # maps whose keys are not str, or not hashable
    msgpack.packb({1: 1}),
    b"\x81\xc0\x01",
    b"\x81\x90\x01",
    b"\x81\x80\x01",
    b"\x81" + BAD_UTF8 + b"\x01",
    # extensions: unknown codes, timestamps broken and whole
    _ext(0, b""),
    _ext(3, b"\x01\x02"),
    _ext(127, b"x" * 20),
    b"\xd4\xff\x00",
    b"\xd7\xff" + b"\xff" * 8,
    b"\xd6\xff\x00\x00\x00\x01",
    # array references that lie: garbage, wrong arity, missing or short frames, bad dtypes,
    # negative, overflowing and too many dimensions
    _ext(1, b""),
    _ext(1, b"\xc1"),
    _ext(1, b"\x93\x01" + BAD_UTF8 + b"\x91\x01"),
    _ref(1),
    _ref(1, "int32"),
    _ref(1, "int32", [1], 4),
    _ref(0, "int32", [1]),
    _ref(-1, "int32", [1]),
    _ref(9, "int32", [1]),
    _ref(True, "int32", [1]),
    _ref(1, "object", [1]),
    _ref(1, "<i4", [1]),
    _ref(1, ["int32"], [1]),
    _ref(1, {"int32": 1}, [1]),
    _ref(1, b"int32", [1]),
    _ref(1, "int32", [-1]),
    _ref(1, "int32", [1.0]),
    _ref(1, "int32", "1"),
    _ref(1, "int32", [3]),
    _ref(1, "int32", [1] * 9),
    _ref(1, "int8", [0, 2**63]),
    _ref(1, "int8", [0, 2**64 - 1, 2**64 - 1]),
    _ref(1, "int8", [2**32, 2**32]),
    _ref(1, "int32", [1]),  # a true reference: decodes where any value may go
    _ref(1, "int8", [2, 2]),
)


def hostile_bytes() -> st.SearchStrategy[bytes]:
    """One encoded value: a listed hostile one, or drawn: str bytes of any kind, any
    extension, integers near the edges, or bytes that need not be MessagePack at all."""
    edge = st.builds(
        lambda e, d: e + d,
        st.sampled_from([0, 2**31, 2**32, 2**53, 2**63, 2**64]),
        st.integers(-3, 3),
    ).filter(lambda n: n < 2**64)
    return st.one_of(
        st.sampled_from(HOSTILE),
        st.binary(max_size=40).map(lambda raw: b"\xd9" + bytes([len(raw)]) + raw),
        st.builds(_ext, st.integers(-128, 127), st.binary(max_size=24)),
        st.builds(
            _ref,
            st.integers(-2, 3),
            st.sampled_from(["int32", "uint8", "float64", "bool", "object", "S4"]),
            st.lists(edge | st.integers(-2, 4), max_size=10),
        ),
        (edge | edge.map(lambda n: -n)).filter(lambda n: n >= -(2**63)).map(msgpack.packb),
        st.binary(min_size=1, max_size=24),
    )


# --- bodies -------------------------------------------------------------------------------


def fields(cls: type) -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    """Every field of ``cls``, nested ones too, as (path into the body, the name an error
    gives it, its type); maps give their key (``KEY``) and the value under ``"k"``."""
    for index, info in enumerate(msgspec.structs.fields(cls)):
        yield from _walk(info.type, (index,), f"{cls.__name__}.{info.name}")


def _walk(
    hint: Any, path: tuple[Any, ...], name: str
) -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    yield path, name, hint
    hint = _unwrap(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_struct(hint):
        for index, info in enumerate(msgspec.structs.fields(hint)):
            yield from _walk(info.type, (*path, index), f"{name}.{info.name}")
    elif origin is tuple and args[-1] is Ellipsis:
        yield from _walk(args[0], (*path, 0), f"{name}[0]")
    elif origin is tuple:
        for index, arg in enumerate(args):
            yield from _walk(arg, (*path, index), f"{name}[{index}]")
    elif origin is dict:
        yield (*path, KEY), f"{name}: map key", str
        yield from _walk(args[1], (*path, "k"), f"{name}[...]")


def takes_text(hint: Any) -> bool:
    """Whether a str at a field of type ``hint`` is decoded as text (so bad UTF-8 there
    is found as such, not as a wrong type)."""
    hint = _unwrap(hint)
    return hint is str or hint is Any


def _unwrap(hint: Any) -> Any:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _is_struct(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, msgspec.Struct)


def _valid(hint: Any, known: Mapping[str, Any], name: str = "") -> Any:
    """A value of type ``hint`` as it travels (structs as lists); ``known`` names the
    values of some fields by name."""
    if name in known:
        return known[name]
    hint = _unwrap(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_struct(hint):
        return [_valid(f.type, known, f.name) for f in msgspec.structs.fields(hint)]
    if origin is tuple and args[-1] is Ellipsis:
        return [_valid(args[0], known)]
    if origin is tuple:
        return [_valid(a, known) for a in args]
    if origin is dict:
        return {"k": _valid(args[1], known)}
    return {int: 1, float: 1.5, str: "s", bytes: b"b", bool: True}.get(hint, 1)


def _replaced(value: Any, path: tuple[Any, ...]) -> Any:
    """``value`` with the marker at ``path``."""
    if not path:
        return _MARK
    step, rest = path[0], path[1:]
    if step == KEY:
        return {_MARK: value["k"]}
    if isinstance(value, dict):
        return {**value, step: _replaced(value[step], rest)}
    return [*value[:step], _replaced(value[step], rest), *value[step + 1 :]]


def packed(value: Any, path: tuple[Any, ...], raw: bytes) -> bytes:
    """``value`` packed, with ``raw`` as the encoding of what is at ``path`` in it."""
    out = msgpack.packb(_replaced(value, path))
    assert out.count(_PACKED_MARK) == 1
    return out.replace(_PACKED_MARK, raw)


def frames(
    cls: type,
    path: tuple[Any, ...],
    raw: bytes,
    *,
    known: Mapping[str, Any] | None = None,
    arrays: tuple[bytes, ...] = (),
    req_id: int = 1,
) -> list[bytes]:
    """A ``cls`` whose field at ``path`` is ``raw``, every other field valid (or as
    ``known`` names it), followed by ``arrays`` as its array frames."""
    known = known or {}
    try:
        body = _body(cls, tuple(known.items()))
    except TypeError:  # a known value that is not hashable (a map): made afresh
        body = _valid(cls, known)
    return [packed([p.PROTOCOL_VERSION, int(cls.KIND), req_id, body], (3, *path), raw), *arrays]


@functools.cache
def _body(cls: type, known: tuple[tuple[str, Any], ...]) -> Any:
    """A valid body for ``cls`` (shared: never changed, only copied where it differs)."""
    return _valid(cls, dict(known))


def decodes(decode: Callable[[list[bytes]], object], sent: list[bytes]) -> bool:
    """Whether ``decode`` (protocol's decode, or payload_from_frames) takes ``sent``."""
    try:
        decode(sent)
    except p.ProtocolError:
        return False
    return True
