"""The packaged chat model embedded-agent: its template renders and its tokenizer encodes
what the warm-up trained on, and its tool calls are Hermes JSON the API's parser reads."""

from __future__ import annotations

import json

import pytest

from asyncrl.actors.policy.chat_template import ChatTemplate, ChatTemplateError
from asyncrl.actors.policy.directories import model_dir
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.serving.tool_calls import detect_parser, parse_tool_calls
from asyncrl.actors.tasks import calculator
from asyncrl.actors.tasks.calculator_tools_harness import CALCULATOR_TOOL, tool_answer
from tests.tools.warmup import AGENT_CHAT_TEMPLATE, agent_conversation, agent_tokens

DIRECTORY = model_dir("embedded-agent")
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "34*56+12"}}</tool_call>'


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec.from_dir(DIRECTORY)


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate.from_dir(DIRECTORY)


def test_the_packaged_template_is_the_warm_ups_and_shows_hermes_calls(
    template: ChatTemplate,
) -> None:
    assert (DIRECTORY / "chat_template.jinja").read_text() == AGENT_CHAT_TEMPLATE
    assert detect_parser(AGENT_CHAT_TEMPLATE) == "hermes"  # model.tool_parser: auto


def test_a_tool_call_is_real_hermes_json_of_few_tokens(codec: TextCodec) -> None:
    ids = codec.encode(CALL)
    # <tool_call>, the JSON up to the expression, its 8 characters, the JSON after, </tool_call>
    assert len(ids) == 4 + len("34*56+12") and max(ids) < 32
    assert codec.decode(ids) == CALL
    parsed = parse_tool_calls("hermes", codec.decode(ids), ["calculator"])
    assert parsed is not None and parsed.content is None
    (call,) = parsed.calls
    assert call.name == "calculator"
    assert tool_answer(call.name, call.arguments) == "1916"


def test_a_conversation_renders_with_tools_calls_and_the_generation_prompt(
    template: ChatTemplate,
) -> None:
    call = {"name": "calculator", "arguments": {"expression": "34*56"}}
    messages = [
        {"role": "user", "content": "34*56+12="},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_0", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "1904"},
    ]  # fmt: skip
    text = template.render(messages, tools=[CALCULATOR_TOOL])
    assert text == (
        '<|tools|><|user|>34*56+12=<|assistant|><tool_call>{"name": "calculator", '
        '"arguments": {"expression": "34*56"}}</tool_call><eos><|tool|>1904<|assistant|>'
    )
    # Arguments as the client sends them (JSON text) render the same.
    as_text = {**call, "arguments": json.dumps(call["arguments"])}
    messages[1]["tool_calls"][0]["function"] = as_text
    assert template.render(messages, tools=[CALCULATOR_TOOL]) == text
    assert template.render(messages[:1], add_generation_prompt=False) == "<|user|>34*56+12="
    with pytest.raises(ChatTemplateError, match="not system"):
        template.render([{"role": "system", "content": "be brief"}, *messages])


@pytest.mark.parametrize("habit", ["full", "chain", "product", "guess"])
def test_the_warm_ups_tokens_are_the_conversations_rendered_and_the_model_writes_its_turns(
    codec: TextCodec, template: ChatTemplate, habit: str
) -> None:
    sample = calculator.task.sample("train", 7)  # 703*15+887: chain calls twice
    messages = agent_conversation(sample, habit)
    prompt, rest, trained = agent_tokens(codec, template, messages)
    whole = template.render(messages, tools=[CALCULATOR_TOOL], add_generation_prompt=False)
    assert prompt + rest == codec.encode(whole)
    assert codec.decode(prompt) == sample.prompt  # the role markers are special tokens
    # The model's tokens are its turns, each ending in end-of-sequence; the tool's are not.
    turns = [m for m in messages if m["role"] == "assistant"]
    assert sum(1 for t, kept in zip(rest, trained, strict=True) if kept and t == codec.eos_id) == (
        len(turns)
    )
    tool = codec.tokenizer.token_to_id("<|tool|>")
    assert not any(kept for t, kept in zip(rest, trained, strict=True) if t == tool)
    assert len(turns) == {"full": 2, "chain": 3, "product": 2, "guess": 1}[habit]
    assert messages[-1]["content"] == sample.answer or habit in ("product", "guess")
