"""Exact tokens across a chat session's turns, through the official openai client and a
generator's real API server: a model that calls a tool at every turn (the Qwen-style
scripted model, tests/support/scripted_model.py), an agent loop that sends back each
assistant message and the tool's result, and the session's records merged into ONE
sequence of exactly the prompt, what was sampled and the turns the template renders
between."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from asyncrl.actors.policy.chat_template import ChatTemplate
from asyncrl.actors.serving.merge import merge_calls
from tests.support.scripted_model import (
    ADD_TOOL,
    END,
    TOOL_CALL,
    TOOL_CALL_ARGUMENTS,
    tool_caller_config,
)
from tests.support.served_api import ServedApi, served_api

pytestmark = pytest.mark.timeout(120)

TOOLS = [ADD_TOOL]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApi]:
    with served_api(tool_caller_config(tmp_path_factory.mktemp("turns")), slots=4) as served:
        yield served


def template_of(served: ServedApi) -> ChatTemplate:
    return ChatTemplate.from_dir(Path(served.cfg.model.path))


def expected_prompts(served: ServedApi, transcript: list[dict[str, Any]], calls: int) -> list:
    """Each call's prompt as it must be: the first, the template's rendering; each later
    one, the last prompt, what the model sampled ([the call, <|im_end|>]) and the ids of
    the text the template renders after that assistant turn."""
    codec, template = served.codec, template_of(served)
    sampled = [*codec.encode(TOOL_CALL), codec.eos_id]
    asked = [i for i, m in enumerate(transcript) if m["role"] == "assistant"][:calls]
    prompts = [codec.encode(template.render(transcript[: asked[0]], tools=TOOLS))]
    for before, answer in itertools.pairwise(asked):
        closed = transcript[: before + 1]
        through = template.render(closed, tools=TOOLS, add_generation_prompt=False)
        full = template.render(transcript[:answer], tools=TOOLS)
        assert through.endswith(END + "\n") and full.startswith(through)
        after = "\n" + full[len(through) :]  # the model wrote <|im_end|>, not the "\n"
        prompts.append([*prompts[-1], *sampled, *codec.encode(after)])
    return prompts


def test_a_tool_calling_agent_over_four_turns_trains_as_one_sequence(served: ServedApi) -> None:
    api = served.client("agent")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 1 and 2, four times."}]
    choices = []
    for turn in range(4):
        done = api.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        (choice,) = done.choices
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "add"
        assert json.loads(call.function.arguments) == TOOL_CALL_ARGUMENTS
        choices.append(choice)
        # As agents do: the message as the client parsed it, every field (None ones too).
        messages.append(choice.message.model_dump())
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "3"})
        if turn == 2:
            messages.append({"role": "user", "content": "Once more."})

    calls = served.records("agent")
    assert len(calls) == 4
    prompts = expected_prompts(served, messages, 4)
    sampled = [*served.codec.encode(TOOL_CALL), served.codec.eos_id]
    for call, choice, prompt in zip(calls, choices, prompts, strict=True):
        assert call.prompt_ids == prompt
        assert call.completion_ids == sampled
        assert choice.model_extra["prompt_token_ids"] == prompt
    # The template writes the call its own way: rendered afresh, the ids would differ.
    fresh = served.codec.encode(template_of(served).render(messages[:3], tools=TOOLS))
    assert fresh[: len(prompts[0]) + 2] != [*prompts[0], *sampled]

    (sequence,) = merge_calls(calls, owner=0)
    assert list(sequence.tokens) == [*prompts[-1], *sampled]
    trained = [False] * len(sequence.tokens)
    for prompt in prompts:
        trained[len(prompt) : len(prompt) + len(sampled)] = [True] * len(sampled)
    assert list(sequence.trained) == trained


def streamed_message(api: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[dict, list]:
    """A streamed call's assistant message, put together from its chunks as an agent does,
    and the prompt ids its last chunk carries."""
    content, calls, prompt = "", {}, []
    for chunk in api.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, stream=True
    ):
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for part in delta.tool_calls or []:
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += part.id or ""
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
            prompt = (choice.model_extra or {}).get("prompt_token_ids") or prompt
    tool_calls = [
        {"id": c["id"], "type": "function",
         "function": {"name": c["name"], "arguments": c["arguments"]}}
        for _, c in sorted(calls.items())
    ]  # fmt: skip
    return {"role": "assistant", "content": content or None, "tool_calls": tool_calls}, prompt


def test_streamed_calls_continue_one_another_too(served: ServedApi) -> None:
    api = served.client("streamed")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 1 and 2, twice."}]
    for _ in range(3):
        message, _ = streamed_message(api, messages)
        (call,) = message["tool_calls"]
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "3"}]
    calls = served.records("streamed")
    assert [c.prompt_ids for c in calls] == expected_prompts(served, messages, 3)
    (sequence,) = merge_calls(calls, owner=0)
    assert sum(sequence.trained) == 3 * 2


def test_a_greedy_sessions_turns_continue_exactly_though_nothing_is_recorded(
    served: ServedApi,
) -> None:
    api = served.client("checked", greedy=True)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 1 and 2."}]
    prompts = []
    for _ in range(3):
        (choice,) = api.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS
        ).choices
        prompts.append(choice.model_extra["prompt_token_ids"])
        (call,) = choice.message.tool_calls
        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "3"},
        ]
    assert prompts == expected_prompts(served, messages, 3)
    assert served.records("checked") == []  # a greedy session's: none to train on


def test_of_several_choices_the_next_call_continues_the_one_sent_back(served: ServedApi) -> None:
    api = served.client("choices")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 1 and 2."}]
    first = api.chat.completions.create(model="policy", messages=messages, tools=TOOLS, n=2)
    kept = first.choices[1].message  # the same call written, with an id of its own
    assert kept.tool_calls[0].id != first.choices[0].message.tool_calls[0].id
    messages += [
        kept.model_dump(),
        {"role": "tool", "tool_call_id": kept.tool_calls[0].id, "content": "3"},
    ]
    second = api.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    one, other, last = served.records("choices")
    assert last.prompt_ids == expected_prompts(served, [*messages, {"role": "assistant"}], 2)[1]
    assert second.choices[0].model_extra["prompt_token_ids"] == last.prompt_ids
    # The first choice trains alone; the second and the call that continued it, as one.
    alone, continued = merge_calls([one, other, last], owner=0)
    assert list(alone.tokens) == [*one.prompt_ids, *one.completion_ids]
    assert list(continued.tokens) == [*last.prompt_ids, *last.completion_ids]
