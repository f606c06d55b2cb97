"""A chat session's later calls, through the official openai client and a generator's real
API server, compute only their new tokens: each call's cache is kept in the decoder for the
next, which extends it (exact tokens across turns, actors/serving/chat_turns.py). Whether
reuse changes a token or a log-prob is the decoder's tests' question
(tests/unit/actors/policy/test_decoder_kept_caches.py); here, that served calls reuse."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from asyncrl.actors.policy.decoder import Decoder
from asyncrl.actors.serving.call_records import CallRecord, decode_records
from asyncrl.actors.serving.directory import ApiDirectory, ApiEntry
from asyncrl.actors.serving.serving import Serving
from asyncrl.actors.startup.model_loading import load_policy
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.contract.rundir import RunDir
from tests.support.scripted_model import QWEN, TOOL_CALL, scripted_model

pytestmark = pytest.mark.timeout(120)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "The sum of a and b.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiEntry, Decoder]]:
    """A generator's API over a model that calls the tool at every turn, decoded on a
    thread as the generate worker's main loop does."""
    root = tmp_path_factory.mktemp("kept")
    directory = scripted_model(root / "model", [TOOL_CALL], QWEN)
    cfg = config_from_dict(
        {
            "run": {"dir": str(root / "run")},
            "data": {"harness": "tests.support.harnesses:ask_once"},
            "model": {"path": str(directory), "max_new_tokens": 8, "max_prompt_tokens": 2048},
        }
    )
    model, codec = load_policy(cfg, "generate")
    decoder = Decoder(
        model, slots=4, max_new_tokens=8, max_prompt_tokens=2048, eos_id=codec.eos_ids,
        pad_id=codec.pad_id,
    )  # fmt: skip
    serving = Serving(
        cfg, "generate-0", codec, vocab_size=model.config.vocab_size, max_prompt_tokens=2048,
        version=0,
    )  # fmt: skip
    stop = threading.Event()

    def decode() -> None:
        while not stop.is_set():
            serving.advance(decoder)
            if not decoder.busy:
                time.sleep(0.002)

    loop = threading.Thread(target=decode, daemon=True)
    loop.start()
    (entry,) = ApiDirectory(RunDir.of(cfg).api_servers).live()
    try:
        yield entry, decoder
    finally:
        stop.set()
        loop.join(5)
        serving.stop()


def records(entry: ApiEntry, session: str) -> list[CallRecord]:
    request = urllib.request.Request(
        f"{entry.url}/sessions/{session}/record", headers={"Authorization": f"Bearer {entry.key}"}
    )
    with urllib.request.urlopen(request, timeout=5) as reply:
        return decode_records(reply.read())


def test_a_chat_sessions_later_calls_compute_only_their_new_tokens(served) -> None:
    entry, decoder = served
    api = openai.OpenAI(base_url=entry.session_url("agent"), api_key=entry.key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 1 and 2, four times."}]
    reported = []
    for _ in range(4):
        done = api.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        reported.append(done.usage.prompt_tokens_details.cached_tokens)
        (choice,) = done.choices
        (call,) = choice.message.tool_calls
        messages.append(choice.message.model_dump())
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "3"})
    calls = records(entry, "agent")
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
