"""The official openai client against a generator's real API server: uvicorn on a free
port, the embedded model decoding in a loop beside it as the generate role's does."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch

from asyncrl.actors.policy.checkpoint import model_dir
from asyncrl.actors.policy.decoder import Request
from asyncrl.actors.policy.sampling import Sampling
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.serving.directory import ApiDirectory, ApiEntry
from asyncrl.actors.serving.http_server import MAX_BODY_BYTES
from asyncrl.actors.serving.merge import merge_calls
from asyncrl.actors.serving.sessions import HarnessFailed, SessionRunner, load_harness
from asyncrl.actors.tasks import Sample
from asyncrl.runtime.contract.rundir import RunDir
from tests.support.cluster import wait_for
from tests.support.served_api import ServedApi, served_api

pytestmark = pytest.mark.timeout(60)

VERSION = 3


@pytest.fixture
def loads() -> list[int]:
    """Versions for the decode loop to load, one after a step with a call in flight."""
    return []


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest, loads: list[int]) -> Iterator[ServedApi]:
    """The embedded model served; ``request.param``: data keys beside the harness."""
    data = {"harness": "tests.support.harnesses:ask_once", **getattr(request, "param", {})}
    config = {
        "run": {"dir": str(tmp_path / "run")},
        "data": data,
        "model": {"max_new_tokens": 24, "max_prompt_tokens": 64},
        "algorithm": {"temperature": 1.0},
    }

    def step(served: ServedApi) -> None:
        decoder = served.decoder
        running = bool(decoder.active)
        served.serving.advance(decoder)
        if loads and running:  # after a step with a sequence in flight
            decoder.load(decoder.model.state_dict(), loads.pop())  # as on_version does

    with served_api(config, slots=8, version=VERSION, step=step) as served:
        yield served
    assert ApiDirectory(RunDir.of(served.cfg).api_servers).live() == []  # withdrawn on stop


def test_completions_and_chat_carry_the_log_probs_the_decoder_sampled(served: ServedApi) -> None:
    assert served.entry.version == VERSION
    api = served.client("s1")
    done = api.completions.create(model="policy", prompt="12+34=", max_tokens=20, logprobs=0)
    (choice,) = done.choices
    assert choice.finish_reason in ("stop", "length")
    assert done.usage.prompt_tokens == 6
    assert done.usage.completion_tokens == len(choice.logprobs.token_logprobs) >= 1
    chat = api.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "5+6="}], logprobs=True
    )
    content = chat.choices[0].logprobs.content
    assert chat.choices[0].message.role == "assistant" and content

    first, second = served.records("s1")
    assert first.prompt_ids == [int(t) for t in first.prompt_ids] and len(first.prompt_ids) == 6
    assert first.logprobs == pytest.approx(choice.logprobs.token_logprobs, abs=0)
    assert "".join(choice.logprobs.tokens).startswith(choice.text)
    assert second.logprobs == pytest.approx([c.logprob for c in content], abs=0)
    assert set(first.versions) == set(second.versions) == {VERSION}
    assert all(lp <= 0 for lp in first.logprobs)
    assert served.records("s1") == []  # taken once: freed


def test_token_ids_in_stop_ids_and_max_tokens_are_honoured(served: ServedApi) -> None:
    decoder = served.decoder
    api = served.client("s2")
    every_id = list(range(decoder.model.config.vocab_size))
    stopped = api.completions.create(
        model="policy", prompt=[4, 5, 6], logprobs=0, extra_body={"stop_token_ids": every_id}
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1
    short = api.completions.create(model="policy", prompt="99+1=", max_tokens=1)
    assert short.usage.completion_tokens == 1
    first, second = served.records("s2")
    assert first.prompt_ids == [4, 5, 6] and not first.truncated
    assert len(first.completion_ids) == len(second.completion_ids) == 1


RUN_SAMPLING = pytest.mark.parametrize("served", [{"harness_sampling": "run"}], indirect=True)


@pytest.mark.parametrize(
    ("asked", "param"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"extra_body": {"top_k": "5"}}, "top_k"),
        ({"extra_body": {"min_p": 1}}, "min_p"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": -1}, "frequency_penalty"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"seed": -1}, "seed"),
        ({"extra_body": {"seed": 1.5}}, "seed"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"n": 0}, "n"),
        ({"n": 129}, "n"),
        ({"stop": [""]}, "stop"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 2}, "logprobs"),
        ({"prompt": [10**9]}, "prompt"),
        ({"prompt": "9" * 100}, "prompt"),
    ],
)
def test_a_request_the_server_cannot_honour_is_a_400_naming_the_field(
    served: ServedApi, asked: dict, param: str
) -> None:
    api = served.client("bad")
    kwargs = {"model": "policy", "prompt": "1+1=", **asked}
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(**kwargs)
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param and param in refused.value.body["message"]
    assert refused.value.body["type"] == "invalid_request_error"
    assert served.records("bad") == []
    # The generator is still serving.
    assert api.completions.create(model="policy", prompt="1+1=", max_tokens=2).choices


@pytest.mark.parametrize(
    ("asked", "param"),
    [
        ({"top_logprobs": 3, "logprobs": True}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "1+1="}]}, "messages"),
        ({"tools": [{"type": "function", "function": {"name": "add"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_a_chat_request_the_server_cannot_honour_is_a_400_naming_the_field(
    served: ServedApi, asked: dict, param: str
) -> None:
    api = served.client("bad-chat")
    kwargs = {"model": "policy", "messages": [{"role": "user", "content": "1+1="}], **asked}
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(**kwargs)
    assert refused.value.body["param"] == param and param in refused.value.body["message"]
    # The embedded model's template shows no tool-call format: the key to set is named.
    if param == "tools":
        assert "model.tool_parser" in refused.value.body["message"]


@RUN_SAMPLING
@pytest.mark.parametrize(
    ("asked", "param"),
    [
        ({"temperature": 0.5}, "temperature"),
        ({"top_p": 0.5}, "top_p"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
        ({"extra_body": {"min_p": 0.1}}, "min_p"),
    ],
)
def test_with_the_runs_sampling_only_other_sampling_is_a_400(
    served: ServedApi, asked: dict, param: str
) -> None:
    api = served.client("run")
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model="policy", prompt="1+1=", **asked)
    assert refused.value.body["param"] == param
    assert f"algorithm.{param}=" in refused.value.body["message"]


@RUN_SAMPLING
def test_the_temperature_refused_is_named_with_the_runs(served: ServedApi) -> None:
    with pytest.raises(openai.BadRequestError, match=r"algorithm\.temperature=1"):
        served.client("t").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "1+1="}], temperature=0.2
        )


def recorded_requests(served: ServedApi, monkeypatch: pytest.MonkeyPatch) -> list[Request]:
    """The decoder's requests from now on, as submitted to it."""
    submitted: list[Request] = []
    submit = served.decoder.submit

    def recording(requests) -> None:
        requests = list(requests)
        submitted.extend(requests)
        submit(requests)

    monkeypatch.setattr(served.decoder, "submit", recording)
    return submitted


@RUN_SAMPLING
def test_the_runs_sampling_named_is_served_and_a_seed_repeats_a_call(
    served: ServedApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    submitted = recorded_requests(served, monkeypatch)
    api = served.client("seeded")
    # The run's own sampling, named: accepted (top_k and min_p as vLLM's clients send them).
    asked = {"temperature": 1.0, "top_p": 1, "seed": 9, "max_tokens": 6, "stop": ["+"]}
    calls = [
        api.completions.create(
            model="policy", prompt="345+6789=", extra_body={"top_k": top_k, "min_p": 0}, **asked
        )
        for top_k in (0, -1)
    ]
    assert calls[0].choices[0].text == calls[1].choices[0].text
    assert len(submitted) == 2
    for request in submitted:
        assert request.seed == 9 and request.max_new_tokens == 6 and request.stop_when
        # The decoder's own sampling (the run's) stands: no per-request override.
        assert (request.temperature, request.top_p, request.top_k) == (None, None, None)
    first, second = served.records("seeded")
    assert first.completion_ids == second.completion_ids and first.logprobs == second.logprobs


def test_a_calls_own_sampling_is_decoded_and_its_log_probs_recorded(
    served: ServedApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    submitted = recorded_requests(served, monkeypatch)
    api = served.client("own")
    done = api.completions.create(
        model="policy", prompt="345+6789=", temperature=0.7, top_p=0.9, logprobs=0,
        extra_body={"top_k": 5, "min_p": 0.05}, max_tokens=8,
    )  # fmt: skip
    (request,) = submitted
    assert (request.temperature, request.top_p, request.top_k, request.min_p) == (0.7, 0.9, 5, 0.05)
    assert not request.greedy
    (call,) = served.records("own")
    assert call.logprobs == done.choices[0].logprobs.token_logprobs
    # They are the log-probs of the distribution the call asked for, recomputed so.
    tokens = torch.tensor([[*call.prompt_ids, *call.completion_ids]])
    columns = torch.arange(len(call.prompt_ids) - 1, tokens.shape[1] - 1)[None]
    with torch.no_grad():
        rescored = served.decoder.model(
            tokens, columns, tokens[:, columns[0] + 1], Sampling(0.7, 0.9, 5, 0.05)
        )
    assert call.logprobs == pytest.approx(rescored[0].tolist(), abs=1e-4)
    # Greedy at temperature 0: the most likely token each time, a sure pick recorded (0).
    greedy = [
        api.completions.create(model="policy", prompt="345+6789=", temperature=0, max_tokens=8)
        for _ in range(2)
    ]
    assert submitted[-1].greedy and submitted[-1].temperature is None
    assert greedy[0].choices[0].text == greedy[1].choices[0].text
    for call in served.records("own"):
        assert call.logprobs == [0.0] * len(call.completion_ids)


def test_a_wrong_key_is_refused(served: ServedApi) -> None:
    entry = served.entry
    wrong = openai.OpenAI(base_url=entry.session_url("k"), api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="policy", prompt="1+1=")


def test_a_body_over_the_limit_is_a_413_before_it_is_read(served: ServedApi) -> None:
    entry = served.entry
    host, port = entry.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(f"POST /sessions/b/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {entry.key}\r\n"
                     f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode())  # fmt: skip
        reply = b""
        while chunk := conn.recv(65536):  # closed by the server, the body never sent
            reply += chunk
    status, _, body = reply.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413"), reply
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


def test_a_version_loaded_during_a_call_is_recorded_per_token(
    served: ServedApi, loads: list[int]
) -> None:
    decoder = served.decoder
    api = served.client("v")
    for _ in range(10):  # until a call runs long enough for a load to land inside it
        before = decoder.version
        loads[:] = [before + 1]
        api.completions.create(model="policy", prompt="12+34=", max_tokens=12)
        (call,) = served.records("v")
        if len(set(call.versions)) > 1:
            break
    assert call.versions == sorted(call.versions)
    assert call.versions[0] == before and call.versions[-1] == before + 1
    # The next call samples under the new version from its first token.
    api.completions.create(model="policy", prompt="12+34=", max_tokens=2)
    (after,) = served.records("v")
    assert set(after.versions) == {before + 1}


def test_calls_that_extend_the_last_one_merge_into_one_sequence(served: ServedApi) -> None:
    api = served.client("m")
    first = api.completions.create(model="policy", prompt="1+2=", max_tokens=6).choices[0]
    assert first.prompt_token_ids == [int(t) for t in first.prompt_token_ids]
    extended = [*first.prompt_token_ids, *first.token_ids, *api_ids("3+4=")]
    second = api.completions.create(model="policy", prompt=extended, max_tokens=6).choices[0]
    api.completions.create(model="policy", prompt="5+6=", max_tokens=6)  # unrelated
    calls = served.records("m")
    first_seq, other = merge_calls(calls, owner=2)
    assert list(first_seq.tokens) == [*extended, *second.token_ids]
    mask = [False] * len(first.prompt_token_ids) + [True] * len(first.token_ids)
    mask += [False] * 4 + [True] * len(second.token_ids)  # "3+4=" is the harness's, untrained
    assert list(first_seq.trained) == mask
    assert list(other.tokens[:4]) == api_ids("5+6=") and other.owner == first_seq.owner == 2


def api_ids(text: str) -> list[int]:
    """The embedded tokenizer's ids of ``text`` (one token per character)."""
    return TextCodec.from_dir(model_dir("embedded")).encode(text)


def run_group(entries: list[ApiEntry], harness: str, timeout_s: float = 20) -> object:
    """One group of 3 sessions of ``harness``, run as the harness role runs them: its
    sequences and rewards, or the HarnessFailed it raised."""
    runner = SessionRunner(
        load_harness(harness), harness, timeout_s=timeout_s, concurrency=2,
        servers=lambda: entries,
    )  # fmt: skip
    try:
        future = runner.run_group(Sample("12+34=", "46"), 3, "g")
        return future.exception(30) or future.result()
    finally:
        runner.stop()


def test_a_group_of_harness_sessions_comes_back_as_one_trajectory_each(served: ServedApi) -> None:
    sequences, rewards = run_group([served.entry], "tests.support.harnesses:ask_once")
    assert [s.owner for s in sequences] == [0, 1, 2] and len(rewards) == 3
    assert all(r in (0.0, 1.0) for r in rewards)
    assert all(
        list(s.tokens[:6]) == api_ids("12+34=") and not any(s.trained[:6]) for s in sequences
    )
    assert served.records("g-0") == []  # collected


def test_a_harness_that_makes_no_call_or_finds_no_generator_fails_its_group(
    served: ServedApi,
) -> None:
    failed = run_group([served.entry], "tests.support.harnesses:never_calls")
    assert isinstance(failed, HarnessFailed) and "made no model call" in str(failed)
    alone = run_group([], "tests.support.harnesses:ask_once", timeout_s=0.3)
    assert isinstance(alone, HarnessFailed)
    assert "found no live generator to call after 0.3 s" in str(alone)


def test_a_stop_text_over_several_tokens_ends_the_call_and_is_cut_from_its_text(
    served: ServedApi,
) -> None:
    api = served.client("stop")
    codec = TextCodec.from_dir(model_dir("embedded"))
    stops = ["+0=", "+1="]  # three tokens each; the first column's carry writes one
    for _ in range(5):  # sampling may end a response before its first column
        done = api.completions.create(model="policy", prompt="4589+123=", stop=stops)
        (call,) = served.records("stop")
        written = codec.decode(call.completion_ids)
        if any(written.endswith(stop) for stop in stops):
            break
    choice = done.choices[0]
    assert choice.finish_reason == "stop" and not call.truncated
    assert written == choice.text + written[-3:] and written[-3:] in stops
    assert not any(stop in choice.text for stop in stops)
    assert choice.token_ids == call.completion_ids  # all sampled, all recorded


def test_a_call_whose_client_goes_away_leaves_the_decoder_and_no_record(served: ServedApi) -> None:
    impatient = openai.OpenAI(
        base_url=served.entry.session_url("gone"), api_key=served.entry.key, max_retries=0,
        timeout=0.3,
    )  # fmt: skip
    with served.steps:  # the call waits for a decode step it will not see
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(model="policy", prompt="1+1=")
        wait_for(lambda: not served.serving.busy, 5, "the abandoned call to be given up")
        requests, cancelled = served.serving.bridge.take()
        assert requests == [] and len(cancelled) == 1  # never reaches the decoder
    assert served.records("gone") == []
    assert served.client("after").completions.create(model="policy", prompt="1+1=")


def test_several_choices_are_decoded_together_each_from_its_own_seed(
    served: ServedApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    submitted = recorded_requests(served, monkeypatch)
    api = served.client("n")
    done = api.completions.create(model="policy", prompt="345+6789=", n=3, seed=5, max_tokens=8)
    assert [c.index for c in done.choices] == [0, 1, 2]
    assert [r.seed for r in submitted] == [5, 6, 7]
    calls = served.records("n")
    assert [c.completion_ids for c in calls] == [c.token_ids for c in done.choices]
    assert done.usage.completion_tokens == sum(len(c.token_ids) for c in done.choices)
    # Choice i is the call seeded seed + i.
    alone = api.completions.create(model="policy", prompt="345+6789=", seed=6, max_tokens=8)
    assert alone.choices[0].token_ids == done.choices[1].token_ids
    chat = api.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "1+2="}], n=2, logprobs=True
    )
    assert len(chat.choices) == 2 and all(c.logprobs.content for c in chat.choices)


def test_a_streamed_chat_call_is_the_call_unstreamed_in_chunks(served: ServedApi) -> None:
    api = served.client("stream")
    asked = {"model": "policy", "messages": [{"role": "user", "content": "4589+123="}],
             "seed": 3, "n": 2, "max_tokens": 20}  # fmt: skip
    whole = api.chat.completions.create(**asked)
    chunks = list(
        api.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True})
    )
    texts, reasons, pieces = ["", ""], [None, None], [0, 0]
    for chunk in chunks[:-1]:
        assert chunk.object == "chat.completion.chunk" and chunk.usage is None
        (choice,) = chunk.choices
        texts[choice.index] += choice.delta.content or ""
        pieces[choice.index] += bool(choice.delta.content)
        reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert texts == [c.message.content for c in whole.choices]
    assert reasons == [c.finish_reason for c in whole.choices]
    # The text came as it was decoded, not whole at the end.
    assert max(pieces) > 1, pieces
    usage = chunks[-1]
    assert usage.choices == []
    # The same counts; the streamed call (the second) may take its prompt from the first's
    # kept caches, which its cached_tokens say.
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(usage.usage, c) for c in counts] == [getattr(whole.usage, c) for c in counts]
    assert len(served.records("stream")) == 4  # two calls of two choices


def test_a_streamed_completion_stops_before_its_stop_text_and_carries_log_probs(
    served: ServedApi,
) -> None:
    api = served.client("stream-text")
    asked = {"model": "policy", "prompt": "4589+123=", "seed": 4, "max_tokens": 20,
             "stop": ["+0=", "+1="], "logprobs": 0}  # fmt: skip
    whole = api.completions.create(**asked).choices[0]
    chunks = list(api.completions.create(**asked, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    last = chunks[-1].choices[0]
    assert last.finish_reason == whole.finish_reason
    assert last.logprobs.token_logprobs == whole.logprobs.token_logprobs
    assert all(c.usage is None for c in chunks)


def test_a_streamed_call_refused_is_a_plain_400(served: ServedApi) -> None:
    api = served.client("stream-bad")
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model="policy", prompt="1+1=", stream=True, top_p=2)
    assert refused.value.body["param"] == "top_p"


def test_an_unknown_route_is_a_404_in_openais_shape(served: ServedApi) -> None:
    api = served.client("route")
    with pytest.raises(openai.NotFoundError) as missing:
        api.models.retrieve("policy")
    assert missing.value.status_code == 404
    assert missing.value.body["type"] == "invalid_request_error"
    assert "/v1/models/policy" in missing.value.body["message"]


def test_a_stream_whose_client_goes_away_leaves_the_decoder_and_no_record(
    served: ServedApi,
) -> None:
    api = served.client("stream-gone")
    with served.steps:  # the call waits for decode steps it will not see
        stream = api.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "1+1="}], n=2, stream=True
        )
        first = next(iter(stream))  # the choices' opening chunks come before any token
        assert first.choices[0].delta.role == "assistant"
        stream.close()
        wait_for(lambda: not served.serving.busy, 5, "the abandoned stream to be given up")
        requests, cancelled = served.serving.bridge.take()
        assert requests == [] and len(cancelled) == 2
    assert served.records("stream-gone") == []
