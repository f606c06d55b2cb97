"""A chat session's later calls, through the official openai client and a generator's real
API server, compute only their new tokens: each call's cache is kept in the decoder for the
next, which extends it (exact tokens across turns, actors/serving/chat_turns.py). Whether
reuse changes a token or a log-prob is the decoder's tests' question
(tests/unit/actors/policy/test_decoder_kept_caches.py); here, that served calls reuse."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.scripted_model import ADD_TOOL, tool_caller_config
from tests.support.served_api import ServedApi, served_api

pytestmark = pytest.mark.timeout(120)

TOOLS = [ADD_TOOL]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApi]:
    """A generator's API over a model that calls the tool at every turn."""
    with served_api(tool_caller_config(tmp_path_factory.mktemp("kept")), slots=4) as served:
        yield served


def test_a_chat_sessions_later_calls_compute_only_their_new_tokens(served: ServedApi) -> None:
    decoder = served.decoder
    api = served.client("agent")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 1 and 2, four times."}]
    reported = []
    for _ in range(4):
        done = api.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        reported.append(done.usage.prompt_tokens_details.cached_tokens)
        (choice,) = done.choices
        (call,) = choice.message.tool_calls
        messages.append(choice.message.model_dump())
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "3"})
    calls = served.records("agent")
    assert len(calls) == 4
    # Each later call starts with the one before and what it sampled, all of which was
    # in its cache but the last sampled token (never fed).
    kept = [len(c.prompt_ids) + len(c.completion_ids) - 1 for c in calls[:-1]]
    for before, after, reused in zip(calls, calls[1:], kept, strict=False):
        assert after.prompt_ids[:reused] == [*before.prompt_ids, *before.completion_ids][:reused]
    assert decoder.prompt_tokens == sum(len(c.prompt_ids) for c in calls)
    assert decoder.cached_prompt_tokens == sum(kept)
    assert reported == [0, *kept]  # each call's usage says what it took from the cache
    computed = sum(len(c.prompt_ids) + len(c.completion_ids) - 1 for c in calls)
    assert decoder.fed_tokens == computed - sum(kept)
    assert decoder.fed_tokens < decoder.prompt_tokens / 2
