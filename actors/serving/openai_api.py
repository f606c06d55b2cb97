"""The OpenAI-compatible routes a generator serves, per rollout session.

A client's ``base_url`` is ``http://HOST:PORT/sessions/<sid>/v1``: the path binds every
call it makes to session ``sid``. Routes::

    POST /sessions/<sid>/v1/chat/completions   messages rendered by the model's chat template
    POST /sessions/<sid>/v1/completions        prompt text, or token ids
    GET  /sessions/<sid>/v1/models             the one model served
    GET  /sessions/<sid>/record                the session's calls (msgpack), then forgotten
    POST /greedy/<sid>/v1/chat/completions and /greedy/<sid>/v1/completions:
                                               the same calls decoded greedily, not recorded
                                               (harness validation sessions, judges)

Sampling (``data.harness_sampling``): with ``request`` a call samples at its own
``temperature`` (0: greedy), ``top_p``, ``top_k`` and ``min_p``, the run's
``algorithm.*`` where it names none, and the behaviour log-probs recorded are those of
the distribution it sampled from (a greedy pick's: 0, it was sure); the trainer's
importance weight (proximal over behaviour) corrects the difference from the run's
distribution. With ``run`` a call may only name the run's (other numbers are refused),
so behaviour and proximal log-probs come from one distribution. ``top_k`` and ``min_p``
are not in OpenAI's API: a client sends them as vLLM's clients do (the openai client's
``extra_body``), top_k -1 or 0 for every token. What would change the distribution
without being recorded (``presence_penalty``, ``frequency_penalty``, ``logit_bias``,
a ``response_format`` other than text) is refused; fields the server does not know are
ignored, as OpenAI's API does.

``n`` choices are decoded together, each recorded as a call of its own (each trains);
with a ``seed`` choice i draws from seed + i, so the same seed, prompt and weights give
the same choices whatever other calls share the decoder's steps. The run's
``algorithm.stop`` texts end a call's response too, besides the call's own ``stop`` (its
text is cut before those, not before the run's). ``stream`` sends OpenAI's chunks as
server-sent events, the text as it is decoded (with ``logprobs`` asked, or tools
offered, each choice comes whole in its last chunk), and with
``stream_options.include_usage`` a last chunk of usage.

Tools (chat): ``tools`` reach the model through its chat template, and its response is
read for tool calls by ``model.tool_parser`` (tool_calls.py): a whole call makes the
message's ``tool_calls`` (arguments as JSON text, ids ``call_<hex>``) and
``finish_reason: "tool_calls"``; anything else stays text. ``tool_choice`` ``none``
offers no tools; ``required`` or a named function is not enforced (no constrained
decoding): the response is what the model wrote, calls or not. An assistant message's
``tool_calls`` go to the template with their arguments as objects; ``tool`` messages pass
as they are.

Responses carry the sampled tokens' log-probs in OpenAI's shapes (no alternatives: the
decoder keeps the sampled token's alone), ``usage`` and ``finish_reason``; the end token
is among the tokens, since it was sampled and is trained. A ``stop`` text ends a call
once the response holds it; the text returned stops before it (as OpenAI's), while every
token sampled, those that wrote the stop text included, is recorded and trained. Each
choice also carries ``prompt_token_ids`` and ``token_ids`` (as vLLM's do): a harness that
sends the next prompt as those ids plus its own makes a call that extends the last one
exactly, so both train as one sequence. A chat harness needs none of that: a chat call
whose messages repeat an earlier call of its session and the assistant message returned
gets that call's prompt and sampled ids, then the template's rendering of what follows
(chat_turns.py), never the earlier turns tokenised again. A request the server cannot
honour exactly, or a malformed one, gets a 4xx in OpenAI's error shape naming the
field. Every route wants the server's bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..policy.chat_template import ChatTemplate, ChatTemplateError
from ..policy.decoder import Finished
from ..policy.decoder import Request as DecodeRequest
from ..policy.sampling import sampling_problem
from ..policy.tokenizer import TextCodec
from .bridge import Bridge
from .call_records import CallRecord, SessionRecords, encode_records
from .chat_turns import ChatPrompt, ChatTurns
from .streaming import DONE, TextDeltas, event
from .tool_calls import parse_tool_calls

__all__ = ["ApiError", "ApiSettings", "make_app"]

MODEL_NAME = "policy"
_MAX_STOP_TEXTS = 4  # as OpenAI's API allows
_MAX_CHOICES = 128  # n, as OpenAI's API allows
# A stop text is looked for in the decoded tail of the response: its length in characters
# plus this many tokens (a token that decodes to part of a character shows nothing).
_STOP_MARGIN_TOKENS = 8
# Fields that would change the distribution sampled in ways the records do not hold (the
# trainer recomputes log-probs of the model's own distribution), with their no-op value.
_UNRECORDED = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
}


class ApiError(Exception):
    """A request refused: an OpenAI-style error reply naming the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": None}}  # fmt: skip

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


GREEDY = "/greedy"  # the path prefix of greedy, unrecorded calls


def _greedy(request: Request) -> bool:
    return request.url.path.startswith(f"{GREEDY}/")


@dataclass(frozen=True)
class ApiSettings:
    token: str  # the bearer token every request must carry
    temperature: float  # the run's sampling (algorithm.*)
    max_new_tokens: int  # the decoder's limit: a larger max_tokens is capped to it
    max_prompt_tokens: int
    vocab_size: int  # token ids given as input must embed
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    sampling: str = "request"  # data.harness_sampling: "request" or "run"
    tool_parser: str | None = None  # the parser of tool calls (tool_calls.py); None: none
    tool_parser_setting: str = "auto"  # model.tool_parser as configured, for errors


@dataclass(frozen=True)
class _Tools:
    """The tools a chat call offers the model, and whether its response is read for calls."""

    offered: list[dict[str, Any]] | None = None  # OpenAI's function definitions
    names: frozenset[str] = frozenset()
    parser: str | None = None  # None: the response is text


_NO_TOOLS = _Tools()


@dataclass(frozen=True)
class _Call:
    prompt: list[int]
    max_new_tokens: int
    stop_ids: frozenset[int]
    stop_texts: tuple[str, ...]
    logprobs: bool
    greedy: bool = False  # the most likely token each time (a greedy session, temperature 0)
    recorded: bool = True  # kept to train on (not a greedy session's)
    seed: int | None = None  # draws of its own, so seeded (None: the decoder's)
    n: int = 1
    # The call's own sampling (data.harness_sampling: request); None: the run's.
    sampling: dict[str, float | int | None] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False  # streamed: a last chunk of usage
    turn: tuple[str, ChatPrompt] | None = None  # a chat call: its session's key, its prompt

    def requests(self, stop_when: Callable[[int], Any]) -> list[DecodeRequest]:
        """The decoder's request of each choice; ``stop_when(i)``: choice i's rule."""
        return [
            DecodeRequest(
                None,
                tuple(self.prompt),
                greedy=self.greedy,
                max_new_tokens=self.max_new_tokens,
                stop_ids=self.stop_ids,
                stop_when=stop_when(i),
                seed=None if self.seed is None else (self.seed + i) % 2**64,
                **self.sampling,
            )
            for i in range(self.n)
        ]


def make_app(
    settings: ApiSettings,
    bridge: Bridge,
    records: SessionRecords,
    codec: TextCodec,
    template: ChatTemplate | None,
) -> Starlette:
    api = _Api(settings, bridge, records, codec, template)
    routes = [
        Route("/sessions/{sid}/v1/chat/completions", api.guarded(api.chat), methods=["POST"]),
        Route("/sessions/{sid}/v1/completions", api.guarded(api.completions), methods=["POST"]),
        Route("/sessions/{sid}/v1/models", api.guarded(api.models), methods=["GET"]),
        Route("/sessions/{sid}/record", api.guarded(api.record), methods=["GET"]),
        # Validation sessions and judges: greedy, and nothing kept to train on.
        Route(f"{GREEDY}/{{sid}}/v1/chat/completions", api.guarded(api.chat), methods=["POST"]),
        Route(f"{GREEDY}/{{sid}}/v1/completions", api.guarded(api.completions), methods=["POST"]),
        Route(f"{GREEDY}/{{sid}}/v1/models", api.guarded(api.models), methods=["GET"]),
    ]
    # An unknown route or method answers in OpenAI's error shape too.
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    message = f"{request.method} {request.url.path}: {error.detail}"
    return ApiError(message, None, error.status_code).response()


class _Api:
    def __init__(
        self,
        settings: ApiSettings,
        bridge: Bridge,
        records: SessionRecords,
        codec: TextCodec,
        template: ChatTemplate | None,
    ) -> None:
        self.settings, self.bridge, self.records = settings, bridge, records
        self.codec, self.template = codec, template
        self.turns = None if template is None else ChatTurns(template, codec, ttl_s=records.ttl_s)
        self._token = settings.token.encode()

    def guarded(self, route: Callable[[Request], Any]) -> Callable[[Request], Any]:
        """``route`` behind the bearer token, its ApiErrors as error replies."""

        async def endpoint(request: Request) -> Response:
            given = request.headers.get("authorization", "").removeprefix("Bearer ").encode()
            if not hmac.compare_digest(given, self._token):
                return ApiError("a valid API key is needed", None, 401).response()
            try:
                return await route(request)
            except ApiError as error:
                return error.response()

        return endpoint

    # --- routes ---------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        body = await _json_body(request)
        tools = self._tools(body)
        logprobs = body.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise ApiError(f"logprobs: got {logprobs!r}; allowed: true or false", "logprobs")
        turn = _turns_key(request)
        prompt = self._chat_prompt(body, tools.offered, turn)
        call = self._call(body, prompt.ids, "messages", bool(logprobs), request)
        call = dataclasses.replace(call, turn=(turn, prompt))
        if call.stream:
            return self._streamed(request, body, call, tools)
        finished = await self._sample(request, call)
        choices = [self._chat_choice(i, f, call, tools) for i, f in enumerate(finished)]
        return self._reply("chat.completion", body, choices, call, finished)

    async def completions(self, request: Request) -> Response:
        body = await _json_body(request)
        for name in ("echo", "suffix"):
            if body.get(name):
                raise ApiError(f"{name}: not supported by this server", name)
        prompt = self._completion_prompt(body.get("prompt"))
        wanted = body.get("logprobs")
        if wanted is not None and (not _whole(wanted) or wanted > 0):
            # OpenAI's logprobs=N asks for the N most likely alternatives too.
            raise ApiError(
                f"logprobs: got {wanted!r}; allowed: 0 (the sampled tokens' log-probs; the "
                "decoder keeps no alternatives)",
                "logprobs",
            )
        call = self._call(body, prompt, "prompt", wanted is not None, request)
        if call.stream:
            return self._streamed(request, body, call, None)
        finished = await self._sample(request, call)
        choices = [self._text_choice(i, f, call) for i, f in enumerate(finished)]
        return self._reply("text_completion", body, choices, call, finished)

    async def models(self, request: Request) -> Response:
        model = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "asyncrl"}
        return JSONResponse({"object": "list", "data": [model]})

    async def record(self, request: Request) -> Response:
        calls = self.records.take(request.path_params["sid"])
        if self.turns is not None:
            self.turns.forget(_turns_key(request))
        return Response(encode_records(calls), media_type="application/msgpack")

    # --- requests -------------------------------------------------------------------------

    def _call(
        self, body: dict[str, Any], prompt: list[int], field: str, logprobs: bool, request: Request
    ) -> _Call:
        """The sampling a request asks for; ApiError for what cannot be served exactly.
        A greedy session's call decodes greedily whatever sampling it names."""
        s = self.settings
        greedy_session = _greedy(request)
        n = body.get("n", 1)
        if n is not None and not (_whole(n) and 1 <= n <= _MAX_CHOICES):
            raise ApiError(f"n: got {n!r}; allowed: an integer from 1 to {_MAX_CHOICES}", "n")
        self._check_recordable(body)
        sampling: dict[str, Any] = {}
        picked = False
        if not greedy_session and s.sampling == "run":
            self._check_run_sampling(body)
        elif not greedy_session:
            sampling = _own_sampling(body)
            picked = sampling.get("temperature") == 0  # greedy: the decoder's own pick
            if picked:
                del sampling["temperature"]
        seed = body.get("seed")
        if seed is not None and not (_whole(seed) and seed < 2**64):
            raise ApiError(f"seed: got {seed!r}; allowed: an integer from 0 to 2**64 - 1", "seed")
        top = body.get("top_logprobs")
        if top is not None and top != 0:
            raise ApiError(
                f"top_logprobs: got {top!r}; allowed: 0 (the decoder keeps the sampled "
                "token's log-prob alone, no alternatives)",
                "top_logprobs",
            )
        if len(prompt) > s.max_prompt_tokens:
            raise ApiError(
                f"{field}: {len(prompt)} tokens; this generator takes at most "
                f"{s.max_prompt_tokens} (model.max_prompt_tokens)",
                field,
            )
        stream, include_usage = _stream_options(body)
        return _Call(
            prompt, self._max_tokens(body), self._stop_ids(body), self._stop_texts(body),
            logprobs, greedy=greedy_session or picked, recorded=not greedy_session, seed=seed,
            n=n or 1, sampling=sampling, stream=stream, include_usage=include_usage,
        )  # fmt: skip

    def _check_recordable(self, body: dict[str, Any]) -> None:
        """ApiError for a field that would sample from a distribution no record holds."""
        for name, neutral in _UNRECORDED.items():
            value = body.get(name)
            if value is not None and value != neutral:
                raise ApiError(
                    f"{name}: got {value!r}; only {neutral} is served (a penalty changes the "
                    "distribution sampled in a way the trainer's log-probs do not know)",
                    name,
                )
        if body.get("logit_bias"):
            raise ApiError(
                "logit_bias: not served (it changes the distribution sampled in a way the "
                "trainer's log-probs do not know)",
                "logit_bias",
            )
        kind = body.get("response_format")
        if kind is not None and kind != {"type": "text"}:
            raise ApiError(
                f"response_format: got {kind!r}; only text is served (no constrained decoding)",
                "response_format",
            )

    def _check_run_sampling(self, body: dict[str, Any]) -> None:
        """ApiError unless the request samples as the run does (or names no sampling)."""
        s = self.settings
        temperature, top_p, top_k = body.get("temperature"), body.get("top_p"), body.get("top_k")
        if temperature is not None and not (
            _number(temperature) and math.isclose(temperature, s.temperature)
        ):
            raise _not_the_runs("temperature", temperature, s.temperature)
        if top_p is not None and not (_number(top_p) and math.isclose(top_p, s.top_p)):
            raise _not_the_runs("top_p", top_p, s.top_p)
        if top_k is not None and top_k == -1:
            top_k = 0  # vLLM's every token
        if top_k is not None and not (_whole(top_k) and top_k == s.top_k):
            raise _not_the_runs("top_k", top_k, s.top_k)
        min_p = body.get("min_p")
        if min_p is not None and not (_number(min_p) and math.isclose(min_p, s.min_p)):
            raise _not_the_runs("min_p", min_p, s.min_p)

    def _max_tokens(self, body: dict[str, Any]) -> int:
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        wanted = body.get(name)
        if wanted is None:
            return self.settings.max_new_tokens
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
            raise ApiError(f"{name}: got {wanted!r}; allowed: an integer >= 1", name)
        return min(wanted, self.settings.max_new_tokens)  # the decoder's cache holds no more

    def _stop_texts(self, body: dict[str, Any]) -> tuple[str, ...]:
        stop = body.get("stop")
        texts = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(texts, list)
            or len(texts) > _MAX_STOP_TEXTS
            or not all(isinstance(t, str) and t for t in texts)
        ):
            raise ApiError(
                f"stop: got {stop!r}; allowed: a non-empty text, or a list of up to "
                f"{_MAX_STOP_TEXTS}",
                "stop",
            )
        return tuple(texts)

    def _stop_when(self, texts: tuple[str, ...]) -> Callable[[list[int]], bool] | None:
        """The decoder's test of a response so far for ``texts`` (run on its thread)."""
        if not texts:
            return None
        window = max(len(t) for t in texts) + _STOP_MARGIN_TOKENS
        decode = self.codec.decode
        return lambda ids: any(t in decode(ids[-window:]) for t in texts)

    def _stop_ids(self, body: dict[str, Any]) -> frozenset[int]:
        ids = body.get("stop_token_ids") or []
        if not isinstance(ids, list) or not all(self._token_id(i) for i in ids):
            raise ApiError("stop_token_ids: expected a list of token ids", "stop_token_ids")
        return frozenset(ids)

    def _tools(self, body: dict[str, Any]) -> _Tools:
        """The tools a chat request offers, checked; ApiError for malformed ones, or for
        tools this server cannot read calls of."""
        tools, choice = body.get("tools"), body.get("tool_choice")
        if tools is None or tools == []:
            if choice in (None, "auto", "none"):
                return _NO_TOOLS
            raise ApiError(f"tool_choice: got {choice!r} with no tools given", "tool_choice")
        if not isinstance(tools, list):
            raise ApiError("tools: expected a list of functions", "tools")
        names = [_function_name(tool, i) for i, tool in enumerate(tools)]
        if len(set(names)) != len(names):
            raise ApiError(f"tools: a function name is given twice in {names}", "tools")
        named = _chosen_function(choice)
        if named is not None and named not in names:
            raise ApiError(f"tool_choice: {named!r} is not among the tools {names}", "tool_choice")
        if choice == "none":
            return _NO_TOOLS  # the model is not told of them
        parser = self.settings.tool_parser
        if parser is None:
            setting = self.settings.tool_parser_setting
            why = (
                "model.tool_parser is none"
                if setting == "none"
                else "the model's chat template shows no tool-call format this server reads "
                "(model.tool_parser=auto); set model.tool_parser to hermes or llama3_json"
            )
            raise ApiError(f"tools: not served: {why}", "tools")
        return _Tools(list(tools), frozenset(names), parser)

    def _chat_prompt(
        self, body: dict[str, Any], tools: list[dict[str, Any]] | None, session: str
    ) -> ChatPrompt:
        """The prompt: the request's messages, offered ``tools``, rendered by the model's
        chat template and encoded, or spliced onto the ids of the session's earlier call it
        continues (chat_turns.py)."""
        if self.turns is None:
            raise ApiError(
                "messages: this model has no chat template; use /v1/completions", "messages"
            )
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError("messages: expected a non-empty list of messages", "messages")
        chat = [_message(m, i) for i, m in enumerate(messages)]
        try:
            prompt = self.turns.prompt(session, chat, tools)
        except ChatTemplateError as error:
            raise ApiError(f"messages: {error}", "messages") from None
        if not prompt.ids:
            raise ApiError("messages: encodes to no tokens", "messages")
        return prompt

    def _completion_prompt(self, prompt: object) -> list[int]:
        if isinstance(prompt, str) and prompt:
            return self._encoded(prompt, "prompt")
        if isinstance(prompt, list) and prompt and all(self._token_id(t) for t in prompt):
            return list(prompt)
        raise ApiError(
            "prompt: expected one non-empty string, or a list of token ids below "
            f"{self.settings.vocab_size}",
            "prompt",
        )

    def _token_id(self, value: object) -> bool:
        return _whole(value) and value < self.settings.vocab_size  # type: ignore[operator]

    def _encoded(self, text: str, field: str) -> list[int]:
        ids = self.codec.encode(text)
        if not ids:
            raise ApiError(f"{field}: encodes to no tokens", field)
        return ids

    # --- decoding -------------------------------------------------------------------------

    def _submit(
        self, call: _Call, progress: Callable[[int, list[int]], None] | None = None
    ) -> list[Future[Finished]]:
        """The call's choices, into the decoder together; ``progress(i, response)`` is
        told of choice i's every token (on the decoder's thread)."""
        stop = self._stop_when(call.stop_texts)

        def stop_when(i: int) -> Callable[[list[int]], bool] | None:
            if progress is None:
                return stop

            def told(response: list[int]) -> bool:
                progress(i, response)
                return stop is not None and stop(response)

            return told

        return self.bridge.submit_all(call.requests(stop_when))

    async def _sample(self, request: Request, call: _Call) -> list[Finished]:
        """The call's choices decoded and recorded; given up (and out of the decoder at its
        next step) if the client goes away first: a harness session that timed out or was
        cancelled leaves no call behind, decoding or recorded."""
        futures = self._submit(call)
        sampled = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait((sampled, gone), return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not sampled.done():
            _cancel(futures)
            sampled.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampled
            raise ApiError("the client went away before its call was decoded", None, 499)
        try:
            finished = sampled.result()
        except RuntimeError as error:  # the generator dropped or stopped its decoder
            raise _unfinished(error) from None
        self._record(request, call, finished)
        return finished

    def _record(self, request: Request, call: _Call, finished: Sequence[Finished]) -> None:
        """Each choice as a call of the session, in order (a greedy session's: none)."""
        if not call.recorded:
            return
        session = request.path_params["sid"]
        for choice in finished:
            self.records.add(
                session,
                CallRecord(
                    prompt_ids=list(call.prompt),
                    completion_ids=list(choice.tokens),
                    # A greedy pick was sure: its behaviour probability is 1.
                    logprobs=[0.0] * len(choice.tokens) if call.greedy else list(choice.logprobs),
                    versions=list(choice.versions),
                    truncated=choice.truncated,
                ),
            )

    # --- responses ------------------------------------------------------------------------

    def _chat_choice(self, index: int, finished: Finished, call: _Call, tools: _Tools) -> dict:
        message, reason = self._assistant(self._text(finished, call), finished, tools)
        self._remember(call, finished, message)
        return {
            "index": index,
            "message": message,
            "logprobs": self._chat_logprobs(finished) if call.logprobs else None,
            "finish_reason": reason,
            **_token_ids(call, finished),
        }

    def _assistant(
        self, text: str, finished: Finished, tools: _Tools
    ) -> tuple[dict[str, Any], str]:
        """The assistant message of a response's text, and its finish reason: tool calls
        where the text makes whole ones, else the text."""
        parsed = None
        if tools.parser is not None:
            parsed = parse_tool_calls(tools.parser, text, tools.names)
        if parsed is None:
            return {"role": "assistant", "content": text}, _finish_reason(finished)
        calls = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.calls
        ]  # fmt: skip
        return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, "tool_calls"

    def _remember(self, call: _Call, finished: Finished, message: dict[str, Any]) -> None:
        """A chat choice returned: its session's next call may continue it exactly."""
        if self.turns is not None and call.turn is not None:
            session, prompt = call.turn
            # The decoder names the last token of a stop text too: only an end token counts.
            end = finished.stopped_by
            ended_by = end if end in self.codec.eos_ids or end in call.stop_ids else None
            self.turns.remember(session, prompt, finished.tokens, message, ended_by)

    def _chat_logprobs(self, finished: Finished) -> dict[str, Any]:
        content = [
            {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
            for tok, lp in zip(self._pieces(finished), finished.logprobs, strict=True)
        ]
        return {"content": content}

    def _text_choice(self, index: int, finished: Finished, call: _Call) -> dict:
        return {
            "index": index,
            "text": self._text(finished, call),
            "logprobs": self._text_logprobs(finished) if call.logprobs else None,
            "finish_reason": _finish_reason(finished),
            **_token_ids(call, finished),
        }

    def _text_logprobs(self, finished: Finished) -> dict[str, Any]:
        pieces = self._pieces(finished)
        offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
        return {
            "tokens": pieces,
            "token_logprobs": list(finished.logprobs),
            "top_logprobs": None,
            "text_offset": offsets,
        }

    def _text(self, finished: Finished, call: _Call) -> str:
        """The response's text, up to the first stop text it holds (without it)."""
        text = self.codec.decode(finished.tokens)
        cuts = [text.find(t) for t in call.stop_texts if t in text]
        return text[: min(cuts)] if cuts else text

    def _pieces(self, finished: Finished) -> list[str]:
        """Each sampled token's own text (special tokens by name)."""
        tokenizer = self.codec.tokenizer
        return [tokenizer.decode([t], skip_special_tokens=False) for t in finished.tokens]

    def _reply(
        self,
        kind: str,
        body: dict[str, Any],
        choices: list[dict],
        call: _Call,
        finished: Sequence[Finished],
    ) -> JSONResponse:
        reply = {
            **_header(kind, body),
            "choices": choices,
            "usage": _usage(call, finished),
        }
        return JSONResponse(reply)

    # --- streams --------------------------------------------------------------------------

    def _streamed(
        self, request: Request, body: dict[str, Any], call: _Call, tools: _Tools | None
    ) -> StreamingResponse:
        """The call's chunks as server-sent events (tools None: a text completion's)."""
        return StreamingResponse(
            self._chunks(request, body, call, tools),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    async def _chunks(
        self, request: Request, body: dict[str, Any], call: _Call, tools: _Tools | None
    ) -> AsyncIterator[bytes]:
        chat = tools is not None
        header = _header("chat.completion.chunk" if chat else "text_completion", body)
        if call.include_usage:
            header["usage"] = None  # as OpenAI's: every chunk but the last has none

        def chunk(choice: dict[str, Any]) -> bytes:
            return event({**header, "choices": [choice]})

        # The text as it is decoded, unless the choice comes whole at its end: its
        # log-probs (the decoder reports those at the end), or tool calls, are asked.
        live = not call.logprobs and not (chat and tools.parser is not None)  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        progress: asyncio.Queue[tuple[int, int, int]] = asyncio.Queue()

        def told(i: int, response: list[int]) -> None:  # on the decoder's thread
            with contextlib.suppress(RuntimeError):  # the loop is closing: nobody listens
                loop.call_soon_threadsafe(progress.put_nowait, (i, len(response), response[-1]))

        futures = self._submit(call, told if live else None)
        waiting = {asyncio.wrap_future(f): i for i, f in enumerate(futures)}
        tokens: list[list[int]] = [[] for _ in futures]
        deltas = [TextDeltas(self.codec.decode, call.stop_texts) for _ in futures]
        finished: list[Finished | None] = [None] * len(futures)
        try:
            if chat:
                for i in range(call.n):
                    yield chunk(_delta(i, {"role": "assistant", "content": ""}))
            while waiting:
                news = asyncio.ensure_future(progress.get())
                await asyncio.wait([news, *waiting], return_when=asyncio.FIRST_COMPLETED)
                told_now = [news.result()] if news.done() else []
                news.cancel()
                while not progress.empty():
                    told_now.append(progress.get_nowait())
                for i in _extended(tokens, told_now):
                    text = deltas[i].add(tokens[i])
                    if text:
                        yield chunk(_delta(i, {"content": text}) if chat else _piece(i, text))
                for done in [f for f in waiting if f.done()]:
                    i = waiting.pop(done)
                    try:
                        finished[i] = done.result()
                    except RuntimeError as error:
                        yield event(_unfinished(error).body())
                        return
                    yield self._last_chunk(i, finished[i], call, tools, deltas[i], chunk)
            done_all = [f for f in finished if f is not None]
            self._record(request, call, done_all)
            if call.include_usage:
                yield event({**header, "choices": [], "usage": _usage(call, done_all)})
            yield DONE
        finally:
            _cancel(futures)  # the client went away (no-op for those finished)

    def _last_chunk(
        self,
        index: int,
        finished: Finished,
        call: _Call,
        tools: _Tools | None,
        deltas: TextDeltas,
        chunk: Callable[[dict[str, Any]], bytes],
    ) -> bytes:
        """A choice's last chunk: the rest of its text (or its tool calls), its log-probs
        if asked, and its finish reason."""
        text = self._text(finished, call)
        if tools is None:
            choice = _piece(index, deltas.finish(text))
            choice["logprobs"] = self._text_logprobs(finished) if call.logprobs else None
        else:
            message, reason = self._assistant(text, finished, tools)
            self._remember(call, finished, message)
            delta: dict[str, Any] = {}
            if "tool_calls" in message:
                if message["content"] is not None:
                    delta["content"] = message["content"]
                delta["tool_calls"] = [
                    {"index": k, **tool_call} for k, tool_call in enumerate(message["tool_calls"])
                ]
            elif rest := deltas.finish(text):
                delta["content"] = rest
            choice = _delta(index, delta)
            choice["logprobs"] = self._chat_logprobs(finished) if call.logprobs else None
        choice["finish_reason"] = reason if tools is not None else _finish_reason(finished)
        return chunk({**choice, **_token_ids(call, finished)})


def _turns_key(request: Request) -> str:
    """Whose chat turns a call continues: its session's (a greedy session's apart)."""
    session = request.path_params["sid"]
    return f"{GREEDY}/{session}" if _greedy(request) else session


def _extended(tokens: list[list[int]], told: list[tuple[int, int, int]]) -> list[int]:
    """Each choice's tokens extended by what the decoder told (choice, count, last token);
    the choices that grew."""
    grew: list[int] = []
    for i, count, token in told:
        if count == len(tokens[i]) + 1:
            tokens[i].append(token)
            if i not in grew:
                grew.append(i)
    return grew


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


def _piece(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": None}


def _header(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    prefix = "chatcmpl" if kind.startswith("chat.") else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": body.get("model") or MODEL_NAME,
    }


def _usage(call: _Call, finished: Sequence[Finished]) -> dict[str, int]:
    completion = sum(len(f.tokens) for f in finished)
    return {
        "prompt_tokens": len(call.prompt),
        "completion_tokens": completion,
        "total_tokens": len(call.prompt) + completion,
    }


def _cancel(futures: Sequence[Future[Finished]]) -> None:
    for future in futures:
        future.cancel()


def _unfinished(error: Exception) -> ApiError:
    return ApiError(f"the generator could not finish this call: {error}", None, 503)


def _stream_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the call is streamed, and with a last chunk of usage."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(f"stream: got {stream!r}; allowed: true or false", "stream")
    options = body.get("stream_options")
    if options is None:
        return bool(stream), False
    if not stream:
        raise ApiError("stream_options: only with stream true", "stream_options")
    usage = options.get("include_usage") if isinstance(options, dict) else None
    if not isinstance(options, dict) or not isinstance(usage, bool | None):
        raise ApiError(
            f"stream_options: got {options!r}; allowed: {{'include_usage': true or false}}",
            "stream_options",
        )
    return True, bool(usage)


def _own_sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields a call names, checked (top_k -1 is vLLM's every token: 0)."""
    given: dict[str, Any] = {}
    temperature = body.get("temperature")
    if temperature is not None:
        if not (_number(temperature) and temperature >= 0 and math.isfinite(temperature)):
            raise ApiError(
                f"temperature: got {temperature!r}; allowed: a number >= 0 (0: greedy)",
                "temperature",
            )
        given["temperature"] = temperature
    defaults = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
    for name in ("top_p", "top_k", "min_p"):
        value = body.get(name)
        if name == "top_k" and value == -1 and not isinstance(value, bool):
            value = 0
        if value is None:
            continue
        problem = sampling_problem(**{**defaults, name: value})
        if problem is not None:
            raise ApiError(f"{name}: {problem}", name)
        given[name] = value
    return given


def _function_name(tool: object, index: int) -> str:
    """A tool's function name; ApiError unless it is OpenAI's function definition."""
    where = f"tools[{index}]"
    function = tool.get("function") if isinstance(tool, dict) else None
    if (
        not isinstance(tool, dict)
        or tool.get("type") != "function"
        or not isinstance(function, dict)
    ):
        raise ApiError(
            f"{where}: expected {{'type': 'function', 'function': {{'name': ...}}}}", "tools"
        )
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ApiError(f"{where}.function.name: expected a non-empty name", "tools")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ApiError(f"{where}.function.parameters: expected a JSON schema object", "tools")
    return name


def _chosen_function(choice: object) -> str | None:
    """The function a ``tool_choice`` names, None for auto, none and required; ApiError
    for anything else."""
    if choice in (None, "auto", "none", "required"):
        return None
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if (
        not isinstance(choice, dict)
        or choice.get("type") != "function"
        or not isinstance(name, str)
    ):
        raise ApiError(
            f"tool_choice: got {choice!r}; allowed: auto, none, required, or "
            "{'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    return name


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed its connection (its body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise ApiError("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError("the request body is not a JSON object")
    return body


def _message(message: object, index: int) -> dict[str, Any]:
    """A chat message for the template: its content as text (a list of text parts
    joined), an assistant's tool calls with their arguments as objects (the client sends
    them as JSON text; templates, as transformers gives them, read objects)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ApiError(f"{where}: expected an object with a role", "messages")
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            raise ApiError(f"{where}.content: only text parts are served", "messages")
        content = "".join(texts)
    if content is not None and not isinstance(content, str):
        raise ApiError(f"{where}.content: expected text", "messages")
    prepared = {**message, "content": content or ""}
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise ApiError(f"{where}.tool_calls: expected a list", "messages")
        prepared["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{k}]")
                                  for k, c in enumerate(calls)]  # fmt: skip
    return prepared


def _tool_call(call: object, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        raise ApiError(f"{where}: expected {{'id', 'type', 'function'}}", "messages")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        raise ApiError(f"{where}.function.name: expected a name", "messages")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise ApiError(
                f"{where}.function.arguments: not JSON: {arguments[:80]!r}", "messages"
            ) from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ApiError(f"{where}.function.arguments: expected a JSON object", "messages")
    return {**call, "type": call.get("type", "function"),
            "function": {**function, "arguments": arguments}}  # fmt: skip


def _not_the_runs(name: str, got: object, runs: float) -> ApiError:
    return ApiError(
        f"{name}: got {got!r}; this run samples at algorithm.{name}={runs:g} (the trainer "
        "recomputes log-probs under it; data.harness_sampling is run), so leave it out or "
        "pass that",
        name,
    )


def _token_ids(call: _Call, finished: Finished) -> dict[str, list[int]]:
    return {"prompt_token_ids": list(call.prompt), "token_ids": list(finished.tokens)}


def _finish_reason(finished: Finished) -> str:
    return "length" if finished.truncated else "stop"


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object) -> bool:
    """An integer >= 0 (JSON's true and false are not counts)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
