"""A model's response text → OpenAI tool calls, in the format its chat template taught it.

Two formats, each a parser by name (``model.tool_parser``):

- ``hermes`` (Hermes, Qwen 2.5 and 3): each call a JSON object in its own block,
  ``<tool_call>\\n{"name": "add", "arguments": {"a": 1}}\\n</tool_call>``, as many as the
  model writes; the text outside the blocks is the message's content. The last block may
  be left open (the model ended its turn right after the object).
- ``llama3_json`` (Llama 3.1 to 3.3): the whole response is the calls, each
  ``{"name": "add", "parameters": {"a": 1}}``, several separated by ``;``, after an
  optional ``<|python_tag|>`` (what comes before the tag is the content).

A response parses into calls only when every call in it is whole: a JSON object with a
``name`` among the functions offered, and its arguments an object. Anything else (broken
JSON, a function not offered, no name) is not a call but the model's text, returned to the
client as content: the model wrote it, and a harness sees what it wrote. Pure functions.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["PARSERS", "Parsed", "ToolCall", "detect_parser", "parse_tool_calls", "tool_parser"]

PARSERS = ("hermes", "llama3_json")

_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI's API carries it


@dataclass(frozen=True, slots=True)
class Parsed:
    """A response with tool calls: the text besides them (None if none), and the calls."""

    content: str | None
    calls: tuple[ToolCall, ...]


class _Malformed(ValueError):
    """What the model wrote looks like a call but is not a whole one."""


def detect_parser(template_source: str) -> str | None:
    """The parser for the tool calls a chat template teaches, from its source: Hermes's
    ``<tool_call>`` tag, Llama 3's ``<|python_tag|>`` or its ``"parameters"`` JSON; None
    when it shows neither."""
    if _HERMES_OPEN in template_source:
        return "hermes"
    if _PYTHON_TAG in template_source or '"parameters"' in template_source:
        return "llama3_json"
    return None


def tool_parser(setting: str, template_source: str | None) -> str | None:
    """The parser ``model.tool_parser`` names: itself, none for ``none``, and for ``auto``
    the one the chat template's source shows (:func:`detect_parser`; none without a
    template). ValueError for another setting."""
    if setting == "none":
        return None
    if setting == "auto":
        return None if template_source is None else detect_parser(template_source)
    if setting not in PARSERS:
        raise ValueError(f"model.tool_parser: got {setting!r}; allowed: auto, none, {PARSERS}")
    return setting


def parse_tool_calls(parser: str, text: str, functions: Collection[str]) -> Parsed | None:
    """The tool calls ``text`` makes in ``parser``'s format, to the ``functions`` offered;
    None when it makes none, or makes one that is not whole (then it is plain text).
    ValueError for a parser not in :data:`PARSERS`."""
    if parser not in PARSERS:
        raise ValueError(f"tool parser {parser!r}: expected one of {PARSERS}")
    try:
        if parser == "hermes":
            return _hermes(text, functions)
        return _llama3_json(text, functions)
    except _Malformed:
        return None


def _hermes(text: str, functions: Collection[str]) -> Parsed | None:
    if _HERMES_OPEN not in text:
        return None
    outside: list[str] = []
    calls: list[ToolCall] = []
    rest = text
    while (start := rest.find(_HERMES_OPEN)) >= 0:
        outside.append(rest[:start])
        body_start = start + len(_HERMES_OPEN)
        end = rest.find(_HERMES_CLOSE, body_start)
        if end < 0:  # left open: the model ended its turn after the object
            body, rest = rest[body_start:], ""
        else:
            body, rest = rest[body_start:end], rest[end + len(_HERMES_CLOSE) :]
        calls.append(_call(_json(body), ("arguments",), functions))
    outside.append(rest)
    return Parsed(_content("".join(outside)), tuple(calls))


def _llama3_json(text: str, functions: Collection[str]) -> Parsed | None:
    before, tag, after = text.partition(_PYTHON_TAG)
    content, body = (before, after) if tag else ("", text)
    body = body.strip()
    if not body.startswith("{"):
        if tag:
            raise _Malformed("nothing but a python tag")
        return None
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    at = 0
    while True:
        try:
            value, at = decoder.raw_decode(body, at)
        except json.JSONDecodeError as error:
            raise _Malformed(str(error)) from None
        calls.append(_call(value, ("parameters", "arguments"), functions))
        at = _skip_space(body, at)
        if at == len(body):
            return Parsed(_content(content), tuple(calls))
        if body[at] != ";":
            raise _Malformed(f"text after a call: {body[at:]!r}")
        at = _skip_space(body, at + 1)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise _Malformed(str(error)) from None


def _call(value: Any, argument_keys: tuple[str, ...], functions: Collection[str]) -> ToolCall:
    """One call from its JSON value; _Malformed unless it names a function offered and its
    arguments (under the first of ``argument_keys`` it has; none: no arguments) are an
    object, or a JSON object's text."""
    if not isinstance(value, dict):
        raise _Malformed("a call is not a JSON object")
    name = value.get("name")
    if not isinstance(name, str) or name not in functions:
        raise _Malformed(f"a call to {name!r}, which is not offered")
    key = next((k for k in argument_keys if k in value), None)
    arguments = {} if key is None else value[key]
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        raise _Malformed("a call's arguments are not an object")
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


def _content(text: str) -> str | None:
    text = text.strip()
    return text or None


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at
