"""Tool calls through the official openai client, against a generator's real API server
and decoder: the model is one that writes what each test scripts (a Hermes-style chat
model, tests/support/scripted_model.py), so its calls, broken ones included, are known."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageToolCall

from tests.support.scripted_model import script_state, scripted_model, tokenizer_ids
from tests.support.served_api import ServedApi, served_api

pytestmark = pytest.mark.timeout(60)

ADD = '{"name": "add", "arguments": {"a": 1, "b": 2}}'
MUL = '{"name": "mul", "arguments": {"a": 3, "b": 4}}'
TWO_CALLS = ["Let me work it out.", "\n<tool_call>\n", ADD, "\n</tool_call>\n", "<tool_call>\n",
             MUL, "\n</tool_call>"]  # fmt: skip
ANSWER = ["The ", "answer ", "is ", "3."]
TOOLS = [
    {"type": "function", "function": {"name": name, "description": f"{name} two numbers",
     "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                     "b": {"type": "number"}}}}}
    for name in ("add", "mul")
]  # fmt: skip
QUESTION = [{"role": "user", "content": "What is 1+2?"}]


def rescript(served: ServedApi, pieces: Sequence[str]) -> None:
    """The model writes ``pieces`` from now on (new weights, loaded between steps)."""
    decoder = served.decoder
    state = script_state(decoder.model, tokenizer_ids(served.codec.tokenizer), pieces)
    with served.steps:
        decoder.load(state, decoder.version + 1)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApi]:
    """The scripted model served, its tool parser told by its (Hermes-style) template."""
    yield from serve(tmp_path_factory.mktemp("tools"), "auto")


@pytest.fixture(scope="module")
def scripted_llama3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApi]:
    """The scripted model served, its responses read as Llama 3's JSON calls."""
    yield from serve(tmp_path_factory.mktemp("llama3"), "llama3_json")


@pytest.fixture(scope="module")
def scripted_unread(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApi]:
    """The scripted model served with model.tool_parser none."""
    yield from serve(tmp_path_factory.mktemp("unread"), "none")


def serve(root: Path, tool_parser: str) -> Iterator[ServedApi]:
    config = {
        "run": {"dir": str(root / "run")},
        "data": {"harness": "tests.support.harnesses:ask_once"},
        "model": {"path": str(scripted_model(root / "model")), "max_new_tokens": 16,
                  "max_prompt_tokens": 1024, "tool_parser": tool_parser},
    }  # fmt: skip
    with served_api(config, slots=8) as served:
        yield served


def test_tool_calls_come_back_as_the_client_parses_them_and_finish_the_turn(
    scripted: ServedApi,
) -> None:
    rescript(scripted, TWO_CALLS)
    api = scripted.client("calls")
    done = api.chat.completions.create(model="policy", messages=QUESTION, tools=TOOLS)
    (choice,) = done.choices
    assert choice.finish_reason == "tool_calls"
    message = choice.message
    assert message.content == "Let me work it out."
    assert all(isinstance(c, ChatCompletionMessageToolCall) for c in message.tool_calls)
    assert [c.function.name for c in message.tool_calls] == ["add", "mul"]
    assert [json.loads(c.function.arguments) for c in message.tool_calls] == [
        {"a": 1, "b": 2},
        {"a": 3, "b": 4},
    ]
    ids = [c.id for c in message.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    # The tools were offered through the chat template.
    prompt = scripted.codec.decode(choice.prompt_token_ids)
    assert "<tools>" in prompt and '"name": "mul"' in prompt
    (call,) = scripted.records("calls")
    assert scripted.codec.decode(call.completion_ids) == "".join(TWO_CALLS)

    # The next turn: the calls as the client sends them back, and their results.
    rescript(scripted, ANSWER)
    turn = [
        *QUESTION,
        message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": c.id, "content": r}
          for c, r in zip(message.tool_calls, ("3", "12"), strict=True)),
    ]  # fmt: skip
    answer = api.chat.completions.create(model="policy", messages=turn, tools=TOOLS)
    (choice,) = answer.choices
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == "The answer is 3."
    prompt = scripted.codec.decode(choice.prompt_token_ids)
    # The arguments reached the template as objects (its tojson writes them back).
    assert f"Let me work it out.<tool_call>\n{ADD}\n</tool_call><tool_call>\n{MUL}" in prompt
    assert "<tool_response>\n3\n</tool_response>" in prompt
    assert "<tool_response>\n12\n</tool_response>" in prompt


@pytest.mark.parametrize(
    "script",
    [
        ["<tool_call>\n", '{"name": "add", "arguments": {"a": 1,', "\n</tool_call>"],
        ["<tool_call>\n", '{"name": "sub", "arguments": {}}', "\n</tool_call>"],
    ],
    ids=["broken-json", "not-offered"],
)
def test_a_malformed_call_is_returned_as_the_text_the_model_wrote(
    scripted: ServedApi, script: list[str]
) -> None:
    rescript(scripted, script)
    api = scripted.client("malformed")
    done = api.chat.completions.create(model="policy", messages=QUESTION, tools=TOOLS)
    (choice,) = done.choices
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == "".join(script)
    assert len(scripted.records("malformed")) == 1  # sampled, so trained


def test_tool_choice_none_offers_no_tools_and_reads_no_calls(scripted: ServedApi) -> None:
    rescript(scripted, TWO_CALLS)
    api = scripted.client("none")
    done = api.chat.completions.create(
        model="policy", messages=QUESTION, tools=TOOLS, tool_choice="none"
    )
    (choice,) = done.choices
    assert "<tools>" not in scripted.codec.decode(choice.prompt_token_ids)
    assert choice.finish_reason == "stop" and choice.message.content == "".join(TWO_CALLS)


def test_a_tool_choice_is_not_enforced_and_one_not_offered_is_a_400(scripted: ServedApi) -> None:
    rescript(scripted, ANSWER)
    api = scripted.client("choice")
    for choice in ("required", {"type": "function", "function": {"name": "mul"}}):
        done = api.chat.completions.create(
            model="policy", messages=QUESTION, tools=TOOLS, tool_choice=choice
        )
        # What the model wrote, no call: there is no constrained decoding.
        assert done.choices[0].message.content == "The answer is 3."
        assert done.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(
            model="policy", messages=QUESTION, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "div"}},
        )  # fmt: skip
    assert refused.value.body["param"] == "tool_choice" and "'div'" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(
            model="policy", messages=QUESTION, tools=[{"type": "function", "function": {}}]
        )
    assert refused.value.body["param"] == "tools"
    bad_arguments = {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{1"}}
        ],
    }
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]\.tool_calls\[0\]"):
        api.chat.completions.create(
            model="policy", messages=[*QUESTION, bad_arguments], tools=TOOLS
        )  # fmt: skip


def test_several_choices_each_call_and_each_is_recorded(scripted: ServedApi) -> None:
    rescript(scripted, TWO_CALLS)
    api = scripted.client("n")
    done = api.chat.completions.create(model="policy", messages=QUESTION, tools=TOOLS, n=3)
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert all(c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 2
               for c in done.choices)  # fmt: skip
    assert len(scripted.records("n")) == 3
    assert done.usage.completion_tokens == 3 * (len(TWO_CALLS) + 1)


def test_streamed_tool_calls_come_in_the_last_chunk(scripted: ServedApi) -> None:
    rescript(scripted, TWO_CALLS)
    api = scripted.client("stream")
    chunks = list(
        api.chat.completions.create(
            model="policy", messages=QUESTION, tools=TOOLS, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    first, last_choice, usage = chunks[0], chunks[-2], chunks[-1]
    assert first.choices[0].delta.role == "assistant"
    (choice,) = last_choice.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.delta.content == "Let me work it out."
    calls = choice.delta.tool_calls
    assert [(c.index, c.function.name) for c in calls] == [(0, "add"), (1, "mul")]
    assert json.loads(calls[1].function.arguments) == {"a": 3, "b": 4}
    assert calls[0].id.startswith("call_") and calls[0].type == "function"
    assert usage.choices == [] and usage.usage.completion_tokens == len(TWO_CALLS) + 1
    assert len(scripted.records("stream")) == 1


def test_llama3_json_calls_are_read_when_the_config_names_that_parser(
    scripted_llama3: ServedApi,
) -> None:
    rescript(scripted_llama3, ['{"name": "add", "parameters": {"a": 1, "b": 2}}', "; ",
                              '{"name": "mul", "parameters": {"a": 3, "b": 4}}'])  # fmt: skip
    api = scripted_llama3.client("llama3")
    done = api.chat.completions.create(model="policy", messages=QUESTION, tools=TOOLS)
    (choice,) = done.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("add", {"a": 1, "b": 2}),
        ("mul", {"a": 3, "b": 4}),
    ]
    # Hermes blocks are only text to this parser.
    rescript(scripted_llama3, ["<tool_call>\n", ADD, "\n</tool_call>"])
    done = api.chat.completions.create(model="policy", messages=QUESTION, tools=TOOLS)
    assert done.choices[0].finish_reason == "stop" and done.choices[0].message.tool_calls is None


def test_with_no_tool_parser_tools_are_offered_and_the_response_is_text(
    scripted_unread: ServedApi,
) -> None:
    rescript(scripted_unread, TWO_CALLS)
    done = scripted_unread.client("unread").chat.completions.create(
        model="policy", messages=QUESTION, tools=TOOLS
    )
    (choice,) = done.choices
    assert "<tools>" in scripted_unread.codec.decode(choice.prompt_token_ids)
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == "".join(TWO_CALLS)
