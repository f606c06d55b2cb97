"""Load a run's configuration: one YAML file plus `key=value` overrides -> frozen RunConfig.

Generic machinery: it walks the dataclasses' type hints and field metadata (see fields.py)
and knows nothing of particular sections. Every error is a one-line ConfigError naming the
dotted key, the value given and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from .fields import CONTROL_CHARACTERS
from .schema import RunConfig

T = TypeVar("T")

# YAML 1.1 (PyYAML) reads `1e-5`, without a dot, as a string; float fields accept that form.
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_SCALAR_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
_SHOW_MAX = 60


class ConfigError(ValueError):
    """A bad configuration. The message is one line: key, value given, what is allowed."""


# --------------------------------------------------------------------------- public API


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read the YAML file at `path` (None: all defaults) and apply `section.key=value` overrides."""
    data = {} if path is None else _read_yaml(Path(path))
    return config_from_dict(data, overrides)


def config_from_dict(data: Mapping[str, Any], overrides: Sequence[str] = ()) -> RunConfig:
    """Validate a plain nested mapping (as read from YAML), after applying overrides."""
    if not isinstance(data, Mapping):
        raise _type_error("config", data, "a mapping of sections")
    raw = copy.deepcopy(dict(data))  # overrides edit it in place; the caller's stays intact
    for text in overrides:
        _apply_override(raw, text)
    return _build(RunConfig, raw, "")


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict of builtins that `config_from_dict` turns back into `cfg`."""
    return _plain(cfg)


def dump_config(cfg: Any) -> str:
    """YAML text of `cfg`, in field order, that `load_config` reads back into `cfg`."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True)


def describe_fields(cls: type = RunConfig) -> list[tuple[str, str, str]]:
    """(dotted key, default as YAML, help with what is allowed) for every leaf field."""
    return list(_describe_fields(cls, ""))


# ------------------------------------------------------------------------ reading input


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"{path}: cannot read config file ({reason})") from None
    data = _parse_yaml(text, f"{path}: invalid YAML")
    if data is None:
        return {}  # an empty file is the all-defaults config
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: top level must be a mapping of sections; got {_show(data)} "
            f"({type(data).__name__})"
        )
    return data


def _parse_yaml(text: str, what: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what}{_yaml_where(exc)}: {_yaml_problem(exc)}") from None


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"{problem} ({context})" if context else problem
    return " ".join(text.split())  # PyYAML's messages span lines; ours must not


def _apply_override(raw: dict[str, Any], text: str) -> None:
    keys, value = _parse_override(text)
    node = raw
    for depth, key in enumerate(keys[:-1], start=1):
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            where = ".".join(keys[:depth])
            raise ConfigError(f"override {text!r}: {where} is {_show(child)}, not a mapping")
        node = child
    node[keys[-1]] = value


def _parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, value = text.partition("=")
    keys = key.strip().split(".")
    if not sep:
        raise ConfigError(f"override {text!r}: no '='; expected section.key=value")
    if not all(keys):
        raise ConfigError(f"override {text!r}: empty key or key part; expected section.key=value")
    return keys, _parse_yaml(value, f"override {text!r}: value is not valid YAML")


# --------------------------------------------------------------------- building objects


def _build(cls: type[T], data: Any, path: str) -> T:
    if data is None:
        data = {}  # a section header whose keys are all commented out
    if not isinstance(data, Mapping):
        raise _type_error(path, data, _describe(cls, {}))
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    _check_keys(data, fields, path)
    hints = _hints(cls)
    kwargs = {
        name: _convert(
            hints[name],
            _over_default(fields[name], value),
            _join(path, name),
            fields[name].metadata,
        )
        for name, value in data.items()
    }
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a cross-field check in __post_init__: "field: got ..."
        raise ConfigError(_join(path, str(exc))) from None


def _over_default(field: dataclasses.Field[Any], value: Any) -> Any:
    # A mapping merges over its field's default, so `pipeline.workers.generate=2` (or a
    # file naming one role) keeps the other roles rather than dropping them.
    if not isinstance(value, Mapping) or field.default_factory is dataclasses.MISSING:
        return value
    default = field.default_factory()
    return {**default, **value} if isinstance(default, dict) else value


def _check_keys(data: Mapping[Any, Any], known: Iterable[str], path: str) -> None:
    known = list(known)
    for key in data:
        if key not in known:
            raise ConfigError(_unknown_key(path, key, known))


# Keys a run's config no longer takes, and what took their place: naming the new key
# spares a user the schema's listing.
MOVED_KEYS = {
    "algorithm.is_cap": "algorithm.correction.offpolicy.cap and algorithm.correction.engine.cap",
}


def _unknown_key(path: str, key: Any, known: list[str]) -> str:
    moved = MOVED_KEYS.get(_join(path, key))
    if moved is not None:
        return f"{_join(path, key)}: moved to {moved}"
    close = difflib.get_close_matches(str(key), known, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    listing = ", ".join(known)
    return f"{_join(path, key)}: unknown key{guess} (keys of {path or 'the config'}: {listing})"


def _convert(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    converter = _CONVERTERS.get(get_origin(tp) or tp)
    if converter is None:  # a schema bug, not a user error
        raise TypeError(f"{path}: unsupported config type {tp!r}")
    return converter(tp, value, path, meta)


def _to_bool(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> bool:
    if not isinstance(value, bool):
        raise _type_error(path, value, _describe(tp, meta))
    return value


def _to_str(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> str:
    if not isinstance(value, str):
        raise _type_error(path, value, _describe(tp, meta))
    if meta.get("one_line") and CONTROL_CHARACTERS.search(value):
        raise ConfigError(f"{path}: got {_show(value)}; allowed: {_describe(tp, meta)}")
    return value


def _to_int(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> int:
    if not _is_int(value):
        raise _type_error(path, value, _describe(tp, meta))
    return _check_range(value, path, meta, _describe(tp, meta))


def _to_float(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> float:
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value)
    if not (_is_int(value) or isinstance(value, float)):
        raise _type_error(path, value, _describe(tp, meta))
    return float(_check_range(value, path, meta, _describe(tp, meta)))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int in Python


def _check_range(value: T, path: str, meta: Mapping[str, Any], allowed: str) -> T:
    low, high, above = meta.get("min"), meta.get("max"), meta.get("exclusive_min")
    # Written so NaN fails every bound.
    ok = (low is None or value >= low) and (high is None or value <= high)  # type: ignore[operator]
    if not (ok and (above is None or value > above)):  # type: ignore[operator]
        raise ConfigError(f"{path}: got {_show(value)}; allowed: {allowed}")
    return value


def _to_literal(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
    choices = get_args(tp)
    if any(value == c and type(value) is type(c) for c in choices):
        return value
    allowed = _describe(tp, meta)
    if isinstance(value, bool) and any(isinstance(c, str) for c in choices):
        # YAML 1.1 reads unquoted on/off/yes/no as booleans: `curve: on` arrives as True.
        allowed += " (quote words such as on/off: YAML reads them as true/false)"
    if type(value) in {type(c) for c in choices}:
        raise ConfigError(f"{path}: got {_show(value)}; allowed: {allowed}")
    raise _type_error(path, value, allowed)


def _to_optional(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
    inner = [a for a in get_args(tp) if a is not type(None)]
    if len(inner) != 1:  # a schema bug, not a user error
        raise TypeError(f"{path}: only `X | None` unions are supported, not {tp!r}")
    return None if value is None else _convert(inner[0], value, path, meta)


def _to_dict(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _type_error(path, value, _describe(tp, meta))
    value_tp = get_args(tp)[1]
    return {
        _dict_key(key, path, meta): _convert(value_tp, item, _join(path, key), meta)
        for key, item in value.items()
    }


def _dict_key(key: Any, path: str, meta: Mapping[str, Any]) -> str:
    if not isinstance(key, str):
        raise ConfigError(
            f"{path}: got key {_show(key)} ({type(key).__name__}); allowed: string keys"
        )
    allowed = meta.get("keys")
    if allowed is not None and key not in allowed:
        raise ConfigError(_unknown_key(path, key, list(allowed)))
    return key


def _to_sequence(tp: Any, value: Any, path: str, meta: Mapping[str, Any]) -> Any:
    if meta.get("one_or_list") and not isinstance(value, list | tuple):
        value = [value]  # `data.train_files=a.parquet` on the command line: a list of one
    if not isinstance(value, list | tuple):
        raise _type_error(path, value, _describe(tp, meta))
    item_tp = get_args(tp)[0]  # list[X] or tuple[X, ...]
    items = [_convert(item_tp, item, f"{path}[{i}]", meta) for i, item in enumerate(value)]
    return tuple(items) if get_origin(tp) is tuple else items


_CONVERTERS: dict[Any, Callable[[Any, Any, str, Mapping[str, Any]], Any]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
    Literal: _to_literal,
    typing.Union: _to_optional,
    types.UnionType: _to_optional,
    dict: _to_dict,
    list: _to_sequence,
    tuple: _to_sequence,
}


# ------------------------------------------------------------------ words for messages


def _describe(tp: Any, meta: Mapping[str, Any]) -> str:
    """What a field allows, in words: "an integer in 0..65535", "one of 'a', 'b'"."""
    origin, args = get_origin(tp), get_args(tp)
    if dataclasses.is_dataclass(tp):
        return "a mapping with keys " + ", ".join(f.name for f in dataclasses.fields(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in args)
    if origin in (typing.Union, types.UnionType):
        inner = [_describe(a, meta) for a in args if a is not type(None)]
        return " or ".join([*inner, "null"])
    if origin is dict:
        keys = meta.get("keys")
        key_words = "one of " + ", ".join(map(repr, keys)) if keys else "a string"
        return f"a mapping of ({key_words}) to ({_describe(args[1], meta)})"
    if origin in (list, tuple):
        one = f"{_describe(args[0], meta)} or " if meta.get("one_or_list") else ""
        return f"{one}a list of ({_describe(args[0], meta)})"
    if meta.get("one_line"):
        return "a string on one line, without control characters"
    return _SCALAR_NAMES[tp] + _bounds(meta)


def _bounds(meta: Mapping[str, Any]) -> str:
    low, high, above = meta.get("min"), meta.get("max"), meta.get("exclusive_min")
    if low is not None and high is not None:
        return f" in {low}..{high}"
    parts = [
        f"{op} {bound}"
        for op, bound in ((">=", low), (">", above), ("<=", high))
        if bound is not None
    ]
    return " " + " and ".join(parts) if parts else ""


def _type_error(path: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{path}: got {_show(value)} ({type(value).__name__}); allowed: {allowed}")


def _show(value: Any) -> str:
    text = repr(value)  # repr escapes newlines, keeping the message on one line
    return text if len(text) <= _SHOW_MAX else text[: _SHOW_MAX - 3] + "..."


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


# ------------------------------------------------------------------- output and help


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _describe_fields(cls: type, prefix: str) -> Iterable[tuple[str, str, str]]:
    hints = _hints(cls)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        key, tp = _join(prefix, field.name), hints[field.name]
        if dataclasses.is_dataclass(tp):
            yield from _describe_fields(tp, key)  # type: ignore[arg-type]
            continue
        allowed = _describe(tp, field.metadata)
        text = f"{field.metadata.get('help', '')} (allowed: {allowed})"
        yield key, _yaml_inline(_field_default(field)), text


def _field_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def _yaml_inline(value: Any) -> str:
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=1 << 30)
    return text.removesuffix("...\n").strip()  # a bare scalar gets an end-of-document mark
