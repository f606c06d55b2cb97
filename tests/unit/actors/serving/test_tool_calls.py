"""Tool calls parsed from a model's text: Hermes/Qwen blocks and Llama 3 JSON, and what
is not a whole call staying text."""

from __future__ import annotations

import json

import pytest

from asyncrl.actors.serving.tool_calls import (
    Parsed,
    ToolCall,
    detect_parser,
    parse_tool_calls,
    tool_parser,
)

OFFERED = ("add", "mul")


def hermes(text: str) -> Parsed | None:
    return parse_tool_calls("hermes", text, OFFERED)


def llama(text: str) -> Parsed | None:
    return parse_tool_calls("llama3_json", text, OFFERED)


def test_a_hermes_call_with_text_before_it() -> None:
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    parsed = hermes(text)
    assert parsed == Parsed("Let me add.", (ToolCall("add", '{"a": 1, "b": 2}'),))
    assert json.loads(parsed.calls[0].arguments) == {"a": 1, "b": 2}


def test_several_hermes_calls_in_one_turn_and_the_last_one_left_open() -> None:
    text = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "mul", "arguments": {"x": "é"}}\n'
    )
    parsed = hermes(text)
    assert parsed is not None and parsed.content is None
    assert parsed.calls == (ToolCall("add", '{"a": 1}'), ToolCall("mul", '{"x": "é"}'))


def test_hermes_arguments_as_json_text_or_left_out() -> None:
    parsed = hermes('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert parsed is not None and parsed.calls == (ToolCall("add", '{"a": 1}'),)
    bare = hermes('<tool_call>{"name": "mul"}</tool_call>')
    assert bare is not None and bare.calls == (ToolCall("mul", "{}"),)


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 3.",  # no call at all
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}\n</tool_call>',  # broken JSON
        '<tool_call>\n{"name": "sub", "arguments": {}}\n</tool_call>',  # not offered
        '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "add", "arguments": [1, 2]}\n</tool_call>',  # not an object
        '<tool_call>["add"]</tool_call>',
        # One whole call and one broken one: the turn is text, not half its calls.
        '<tool_call>{"name": "add", "arguments": {}}</tool_call><tool_call>{"name": </tool_call>',
    ],
)
def test_what_is_not_a_whole_hermes_call_is_text(text: str) -> None:
    assert hermes(text) is None


def test_llama3_calls_with_and_without_the_python_tag() -> None:
    one = llama('{"name": "add", "parameters": {"a": 1, "b": 2}}')
    assert one == Parsed(None, (ToolCall("add", '{"a": 1, "b": 2}'),))
    several = llama(
        '<|python_tag|>{"name": "add", "parameters": {"s": "x;y"}}; '
        '{"name": "mul", "arguments": {}}'
    )
    assert several is not None
    assert several.calls == (ToolCall("add", '{"s": "x;y"}'), ToolCall("mul", "{}"))
    tagged = llama('Calling it.<|python_tag|>{"name": "mul", "parameters": {"a": 3}}')
    assert tagged == Parsed("Calling it.", (ToolCall("mul", '{"a": 3}'),))


@pytest.mark.parametrize(
    "text",
    [
        "3",
        'The call would be {"name": "add"}',  # text first: an answer that quotes JSON
        '{"name": "add", "parameters": {"a": 1}',  # broken
        '{"name": "add", "parameters": {}} and more',  # text after the calls
        '{"name": "div", "parameters": {}}',  # not offered
        "<|python_tag|>print(1)",  # code for a built-in tool: not a function call
    ],
)
def test_what_is_not_a_whole_llama3_call_is_text(text: str) -> None:
    assert llama(text) is None


def test_the_parser_is_told_by_the_chat_template() -> None:
    qwen = "{%- if tools %}<tools>{{ tool | tojson }}</tools> ... <tool_call>{% endif %}"
    assert detect_parser(qwen) == "hermes"
    assert detect_parser("{{- '<|python_tag|>' + tool_call.name }}") == "llama3_json"
    assert detect_parser('{"name": function name, "parameters": dictionary}') == "llama3_json"
    assert detect_parser("{% for m in messages %}{{ m.content }}{% endfor %}") is None


def test_an_unknown_parser_is_named() -> None:
    with pytest.raises(ValueError, match="'xml'"):
        parse_tool_calls("xml", "", OFFERED)


def test_the_configured_parser_wins_and_none_turns_parsing_off() -> None:
    hermes_template = "... <tool_call> ..."
    assert tool_parser("auto", hermes_template) == "hermes"
    assert tool_parser("auto", None) is None  # no chat template at all
    assert tool_parser("llama3_json", hermes_template) == "llama3_json"
    assert tool_parser("none", hermes_template) is None
    with pytest.raises(ValueError, match=r"model\.tool_parser"):
        tool_parser("xml", hermes_template)
