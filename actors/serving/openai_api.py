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

Each call is sampled as the run samples: ``algorithm.temperature``, ``top_p``, ``top_k``
and ``min_p`` (the trainer recomputes log-probs under them, so others would train on
numbers that were never sampled): a request may leave them out or name the run's, and one
asking for others is refused. ``top_k`` and ``min_p`` are not in OpenAI's API: a client
sends them as vLLM's clients do (the openai client's ``extra_body``), top_k -1 or 0 for
every token. The run's ``algorithm.stop`` texts end a call's response too, besides the
call's own ``stop`` (its text is cut before those, not before the run's). A ``seed``
makes a call's draws reproducible: the same seed, prompt and weights give the same
tokens, whatever other calls share the decoder's steps. A request the server cannot
honour exactly (streaming, several choices) gets a 400 naming the field, in OpenAI's
error shape; so does a malformed one. Responses carry the sampled tokens' log-probs in
OpenAI's shapes, ``usage`` and ``finish_reason``; the end token is among the tokens,
since it was sampled and is trained. A ``stop`` text ends a call once the response holds
it; the text returned stops before it (as OpenAI's), while every token sampled, those
that wrote the stop text included, is recorded and trained. Each choice also carries
``prompt_token_ids`` and ``token_ids`` (as vLLM's do): a harness that sends the next
prompt as those ids plus its own makes a call that extends the last one exactly, so both
train as one sequence. Every route wants the server's bearer token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..policy.chat_template import ChatTemplate, ChatTemplateError
from ..policy.decoder import Finished
from ..policy.tokenizer import TextCodec
from .bridge import Bridge
from .call_records import CallRecord, SessionRecords, encode_records

__all__ = ["ApiError", "ApiSettings", "make_app"]

MODEL_NAME = "policy"
_MAX_STOP_TEXTS = 4  # as OpenAI's API allows
# A stop text is looked for in the decoded tail of the response: its length in characters
# plus this many tokens (a token that decodes to part of a character shows nothing).
_STOP_MARGIN_TOKENS = 8


class ApiError(Exception):
    """A request refused: an OpenAI-style error reply naming the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        error = {"message": self.message, "type": kind, "param": self.param, "code": None}
        return JSONResponse({"error": error}, status_code=self.status)


GREEDY = "/greedy"  # the path prefix of greedy, unrecorded calls


def _greedy(request: Request) -> bool:
    return request.url.path.startswith(f"{GREEDY}/")


@dataclass(frozen=True)
class ApiSettings:
    token: str  # the bearer token every request must carry
    temperature: float  # the run's sampling, the only one served (algorithm.*)
    max_new_tokens: int  # the decoder's limit: a larger max_tokens is capped to it
    max_prompt_tokens: int
    vocab_size: int  # token ids given as input must embed
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0


@dataclass(frozen=True)
class _Call:
    prompt: list[int]
    max_new_tokens: int
    stop_ids: frozenset[int]
    stop_texts: tuple[str, ...]
    logprobs: bool
    greedy: bool = False  # a greedy session's call: the most likely token each time
    seed: int | None = None  # draws of its own, so seeded (None: the decoder's)


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
    return Starlette(routes=routes)


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
        call = self._call(
            body, self._chat_prompt(body), "messages", bool(body.get("logprobs")), request
        )
        finished = await self._sample(request, call)
        text = self._text(finished, call)
        logprobs = None
        if call.logprobs:
            content = [
                {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
                for tok, lp in zip(self._pieces(finished), finished.logprobs, strict=True)
            ]
            logprobs = {"content": content}
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": _finish_reason(finished),
            **_token_ids(call, finished),
        }
        return self._reply("chat.completion", body, choice, call, finished)

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
                f"logprobs: got {wanted!r}; allowed: 0 (the sampled tokens' log-probs; no "
                "alternatives are served)",
                "logprobs",
            )
        call = self._call(body, prompt, "prompt", wanted is not None, request)
        finished = await self._sample(request, call)
        logprobs = None
        if call.logprobs:
            pieces = self._pieces(finished)
            offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
            logprobs = {
                "tokens": pieces,
                "token_logprobs": list(finished.logprobs),
                "top_logprobs": None,
                "text_offset": offsets,
            }
        choice = {
            "index": 0,
            "text": self._text(finished, call),
            "logprobs": logprobs,
            "finish_reason": _finish_reason(finished),
            **_token_ids(call, finished),
        }
        return self._reply("text_completion", body, choice, call, finished)

    async def models(self, request: Request) -> Response:
        model = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "asyncrl"}
        return JSONResponse({"object": "list", "data": [model]})

    async def record(self, request: Request) -> Response:
        calls = self.records.take(request.path_params["sid"])
        return Response(encode_records(calls), media_type="application/msgpack")

    # --- requests -------------------------------------------------------------------------

    def _call(
        self, body: dict[str, Any], prompt: list[int], field: str, logprobs: bool, request: Request
    ) -> _Call:
        """The sampling a request asks for; ApiError for what cannot be served exactly.
        A greedy session's call decodes greedily whatever temperature it names."""
        s = self.settings
        greedy = _greedy(request)
        if body.get("stream"):
            raise ApiError("stream: streaming is not served; ask without it", "stream")
        if body.get("n", 1) != 1:
            raise ApiError(f"n: got {body.get('n')!r}; allowed: 1", "n")
        if not greedy:
            self._check_run_sampling(body)
        seed = body.get("seed")
        if seed is not None and not (_whole(seed) and seed < 2**64):
            raise ApiError(f"seed: got {seed!r}; allowed: an integer from 0 to 2**64 - 1", "seed")
        if body.get("top_logprobs"):
            raise ApiError("top_logprobs: only 0 is served (no alternatives)", "top_logprobs")
        if len(prompt) > s.max_prompt_tokens:
            raise ApiError(
                f"{field}: {len(prompt)} tokens; this generator takes at most "
                f"{s.max_prompt_tokens} (model.max_prompt_tokens)",
                field,
            )
        stops = self._stop_texts(body)
        return _Call(
            prompt, self._max_tokens(body), self._stop_ids(body), stops, logprobs, greedy, seed
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

    def _chat_prompt(self, body: dict[str, Any]) -> list[int]:
        if self.template is None:
            raise ApiError(
                "messages: this model has no chat template; use /v1/completions", "messages"
            )
        if body.get("tools"):
            raise ApiError("tools: not served yet; describe tools in the messages", "tools")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError("messages: expected a non-empty list of messages", "messages")
        chat = [_message(m, i) for i, m in enumerate(messages)]
        try:
            text = self.template.render(chat)
        except ChatTemplateError as error:
            raise ApiError(f"messages: {error}", "messages") from None
        return self._encoded(text, "messages")

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

    async def _sample(self, request: Request, call: _Call) -> Finished:
        """The call decoded and recorded; given up (and out of the decoder at its next
        step) if the client goes away first: a harness session that timed out or was
        cancelled leaves no call behind, decoding or recorded."""
        stop_when = self._stop_when(call.stop_texts)
        future = self.bridge.submit(
            call.prompt,
            call.max_new_tokens,
            call.stop_ids,
            stop_when,
            greedy=call.greedy,
            seed=call.seed,
        )
        sampled = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait((sampled, gone), return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not sampled.done():
            sampled.cancel()  # cancels the bridge's future too
            raise ApiError("the client went away before its call was decoded", None, 499)
        try:
            finished = sampled.result()
        except RuntimeError as error:  # the generator dropped or stopped its decoder
            raise ApiError(
                f"the generator could not finish this call: {error}", None, 503
            ) from None
        if call.greedy:
            return finished  # a greedy session's: nothing to train on
        session = request.path_params["sid"]
        self.records.add(
            session,
            CallRecord(
                prompt_ids=list(call.prompt),
                completion_ids=list(finished.tokens),
                logprobs=list(finished.logprobs),
                versions=list(finished.versions),
                truncated=finished.truncated,
            ),
        )
        return finished

    # --- responses ------------------------------------------------------------------------

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
        self, kind: str, body: dict[str, Any], choice: dict, call: _Call, finished: Finished
    ) -> JSONResponse:
        usage = {
            "prompt_tokens": len(call.prompt),
            "completion_tokens": len(finished.tokens),
            "total_tokens": len(call.prompt) + len(finished.tokens),
        }
        reply = {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model") or MODEL_NAME,
            "choices": [choice],
            "usage": usage,
        }
        return JSONResponse(reply)


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
    """A chat message with its content as text (a list of text parts joined)."""
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
    return {**message, "content": content or ""}


def _not_the_runs(name: str, got: object, runs: float) -> ApiError:
    return ApiError(
        f"{name}: got {got!r}; this run samples at algorithm.{name}={runs:g} (the trainer "
        "recomputes log-probs under it), so leave it out or pass that",
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
