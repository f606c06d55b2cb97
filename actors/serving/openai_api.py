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

A call goes: its body read into the call the decoder serves (api_requests.py: sampling,
``n``, ``seed``, ``stop``, ``max_tokens``, tools and messages), its choices decoded
together through the bridge to the generator's decode loop, each choice recorded as a
call of its own session (each trains; a greedy session's: none), and the reply built in
OpenAI's shapes (api_replies.py), or with ``stream`` sent as chunks while it is decoded
(api_streams.py). A call whose client goes away before it is decoded is given up and
leaves no record. A chat choice returned is remembered (chat_turns.py): the session's
next call whose messages repeat this call's and that assistant message gets this call's
prompt and sampled ids, then the template's rendering of what follows, never the earlier
turns tokenised again. A request the server cannot honour exactly, or a malformed one,
gets a 4xx in OpenAI's error shape naming the field (api_errors.py). Every route wants
the server's bearer token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..policy.decoder import Finished
from ..policy.tokenizer import TextCodec
from .api_errors import ApiError, unfinished
from .api_replies import MODEL_NAME, Replies, reply
from .api_requests import ApiSettings, Call, RequestReader, Tools, json_body
from .api_streams import CallStream, Progress
from .bridge import Bridge
from .call_records import CallRecord, SessionRecords, encode_records
from .chat_turns import ChatTurns

__all__ = ["ApiSettings", "make_app"]

GREEDY = "/greedy"  # the path prefix of greedy, unrecorded calls


def _greedy(request: Request) -> bool:
    return request.url.path.startswith(f"{GREEDY}/")


def make_app(
    settings: ApiSettings,
    bridge: Bridge,
    records: SessionRecords,
    codec: TextCodec,
    turns: ChatTurns | None,
) -> Starlette:
    """The API's routes; ``turns``: the chat sessions' turns (None: the model has no chat
    template, and chat calls are refused)."""
    api = _Api(settings, bridge, records, codec, turns)
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
        turns: ChatTurns | None,
    ) -> None:
        self.bridge, self.records, self.codec = bridge, records, codec
        self.turns = turns
        self.reader = RequestReader(settings, codec, self.turns)
        self.replies = Replies(codec)
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
        body = await json_body(request)
        call, tools = self.reader.chat(body, _turns_key(request), greedy=_greedy(request))
        if call.stream:
            return self._streamed(request, body, call, tools)
        finished = await self._sample(request, call)
        choices = [self.replies.chat_choice(i, f, call, tools) for i, f in enumerate(finished)]
        for choice, response in zip(choices, finished, strict=True):
            self._remember(call, response, choice["message"])
        return JSONResponse(reply("chat.completion", body, choices, call, finished))

    async def completions(self, request: Request) -> Response:
        body = await json_body(request)
        call = self.reader.completion(body, greedy=_greedy(request))
        if call.stream:
            return self._streamed(request, body, call, None)
        finished = await self._sample(request, call)
        choices = [self.replies.text_choice(i, f, call) for i, f in enumerate(finished)]
        return JSONResponse(reply("text_completion", body, choices, call, finished))

    async def models(self, request: Request) -> Response:
        model = {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "asyncrl"}
        return JSONResponse({"object": "list", "data": [model]})

    async def record(self, request: Request) -> Response:
        calls = self.records.take(request.path_params["sid"])
        if self.turns is not None:
            self.turns.forget(_turns_key(request))
        return Response(encode_records(calls), media_type="application/msgpack")

    # --- decoding -------------------------------------------------------------------------

    def _submit(self, call: Call, progress: Progress | None = None) -> list[Future[Finished]]:
        """The call's choices, into the decoder together; ``progress(i, response)`` is
        told of choice i's every token (on the decoder's thread)."""
        stop = call.stop_test(self.codec.decode)

        def stop_when(i: int) -> Callable[[list[int]], bool] | None:
            if progress is None:
                return stop

            def told(response: list[int]) -> bool:
                progress(i, response)
                return stop is not None and stop(response)

            return told

        return self.bridge.submit_all(call.requests(stop_when))

    async def _sample(self, request: Request, call: Call) -> list[Finished]:
        """The call's choices decoded and recorded; given up (and out of the decoder at its
        next step) if the client goes away first: a harness session that timed out or was
        cancelled leaves no call behind, decoding or recorded."""
        futures = self._submit(call)
        sampled = asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait((sampled, gone), return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not sampled.done():
            for future in futures:
                future.cancel()
            sampled.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampled
            raise ApiError("the client went away before its call was decoded", None, 499)
        try:
            finished = sampled.result()
        except RuntimeError as error:  # the generator dropped or stopped its decoder
            raise unfinished(error) from None
        self._record(request, call, finished)
        return finished

    def _streamed(
        self, request: Request, body: dict[str, Any], call: Call, tools: Tools | None
    ) -> StreamingResponse:
        """The call's chunks as server-sent events (tools None: a text completion's)."""
        chunks = CallStream(call, body, self.replies, tools).chunks(
            submit=lambda progress: self._submit(call, progress),
            returned=lambda finished, message: self._remember(call, finished, message),
            done=lambda finished: self._record(request, call, finished),
        )
        return StreamingResponse(
            chunks, media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )

    # --- what is kept of a call -----------------------------------------------------------

    def _record(self, request: Request, call: Call, finished: Sequence[Finished]) -> None:
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

    def _remember(self, call: Call, finished: Finished, message: dict[str, Any]) -> None:
        """A chat choice returned: its session's next call may continue it exactly."""
        if self.turns is not None and call.turn is not None:
            session, prompt = call.turn
            # The decoder names the last token of a stop text too: only an end token counts.
            end = finished.stopped_by
            ended_by = end if end in self.codec.eos_ids or end in call.stop_ids else None
            self.turns.remember(session, prompt, finished.tokens, message, ended_by)


def _turns_key(request: Request) -> str:
    """Whose chat turns a call continues: its session's (a greedy session's apart)."""
    session = request.path_params["sid"]
    return f"{GREEDY}/{session}" if _greedy(request) else session


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed its connection (its body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
