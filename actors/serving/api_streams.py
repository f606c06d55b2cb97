"""A streamed call (``stream: true``): its choices as OpenAI's chunks, sent as decoded.

Each chunk is a server-sent event (streaming.py). A chat stream opens with a chunk of
each choice's role; then each choice's text comes as it is decoded (never a character
that may not stay in it), unless the choice comes whole in its last chunk: its
log-probs are asked (the decoder reports those at the end), or tools are read for calls.
A choice's last chunk holds the rest of its text or its tool calls, its log-probs if
asked, its finish reason and its ``prompt_token_ids`` and ``token_ids``. With
``stream_options.include_usage`` every chunk carries ``usage: null`` and a last one, of
no choices, the usage. ``[DONE]`` ends the stream; a call the generator could not finish
ends it with an error event instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection
from concurrent.futures import Future
from typing import Any

from ..policy.decoder import Finished
from .api_errors import unfinished
from .api_replies import Replies, finish_reason, header, token_ids, usage
from .api_requests import Call, Tools
from .streaming import DONE, TextDeltas, event

__all__ = ["CallStream", "Progress"]

# Told of choice i's response so far, on the decoder's thread.
Progress = Callable[[int, list[int]], None]


class CallStream:
    """The chunks of ``call``, streamed in answer to ``body``; ``tools`` None: a text
    completion's, else a chat call's."""

    def __init__(
        self, call: Call, body: dict[str, Any], replies: Replies, tools: Tools | None
    ) -> None:
        self.call, self.body, self.replies, self.tools = call, body, replies, tools

    async def chunks(
        self,
        submit: Callable[[Progress | None], list[Future[Finished]]],
        returned: Callable[[Finished, dict[str, Any]], None],
        done: Callable[[list[Finished]], None],
    ) -> AsyncIterator[bytes]:
        """The stream's events. ``submit``: the call's choices into the decoder, told of
        their progress if it is given; ``returned``: a chat choice's message is sent;
        ``done``: every choice is (before the usage and ``[DONE]``)."""
        call, chat = self.call, self.tools is not None
        head = header("chat.completion.chunk" if chat else "text_completion", self.body)
        if call.include_usage:
            head["usage"] = None  # as OpenAI's: every chunk but the last has none

        def chunk(choice: dict[str, Any]) -> bytes:
            return event({**head, "choices": [choice]})

        # The text as it is decoded, unless the choice comes whole at its end.
        live = not call.logprobs and (self.tools is None or self.tools.parser is None)
        told = _Told(call.n)
        futures = submit(told.progress if live else None)
        waiting = {asyncio.wrap_future(f): i for i, f in enumerate(futures)}
        tokens: list[list[int]] = [[] for _ in futures]
        deltas = [TextDeltas(self.replies.codec.decode, call.stop_texts) for _ in futures]
        finished: list[Finished | None] = [None] * len(futures)
        try:
            if chat:
                for i in range(call.n):
                    yield chunk(_delta(i, {"role": "assistant", "content": ""}))
            while waiting:
                for i in _extended(tokens, await told.news(waiting)):
                    text = deltas[i].add(tokens[i])
                    if text:
                        yield chunk(_delta(i, {"content": text}) if chat else _piece(i, text))
                for ended in [f for f in waiting if f.done()]:
                    i = waiting.pop(ended)
                    try:
                        finished[i] = ended.result()
                    except RuntimeError as error:
                        yield event(unfinished(error).body())
                        return
                    yield chunk(self._last(i, finished[i], deltas[i], returned))
            done_all = [f for f in finished if f is not None]
            done(done_all)
            if call.include_usage:
                yield event({**head, "choices": [], "usage": usage(call, done_all)})
            yield DONE
        finally:
            for future in futures:  # the client went away (no-op for those finished)
                future.cancel()

    def _last(
        self,
        index: int,
        finished: Finished,
        deltas: TextDeltas,
        returned: Callable[[Finished, dict[str, Any]], None],
    ) -> dict[str, Any]:
        """A choice's last chunk: the rest of its text (or its tool calls), its log-probs
        if asked, and its finish reason."""
        call, replies = self.call, self.replies
        text = replies.text(finished, call)
        if self.tools is None:
            choice = _piece(index, deltas.finish(text))
            choice["logprobs"] = replies.text_logprobs(finished) if call.logprobs else None
            choice["finish_reason"] = finish_reason(finished)
        else:
            message, reason = replies.assistant(text, finished, self.tools)
            returned(finished, message)
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
            choice["logprobs"] = replies.chat_logprobs(finished) if call.logprobs else None
            choice["finish_reason"] = reason
        return {**choice, **token_ids(call, finished)}


class _Told:
    """What the decoder tells of the choices' responses on its thread, passed to the
    event loop: each choice's new tokens alone (an engine may report several at once)."""

    def __init__(self, n: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, list[int]]] = asyncio.Queue()
        self.reported = [0] * n  # tokens passed on, per choice (the decoder's thread's)

    def progress(self, i: int, response: list[int]) -> None:  # on the decoder's thread
        new, self.reported[i] = response[self.reported[i] :], len(response)
        with contextlib.suppress(RuntimeError):  # the loop is closing: nobody listens
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (i, new))

    async def news(
        self, waiting: Collection[asyncio.Future[Finished]]
    ) -> list[tuple[int, list[int]]]:
        """What was told (choice, new tokens) once anything was, or a choice ended."""
        news = asyncio.ensure_future(self.queue.get())
        await asyncio.wait([news, *waiting], return_when=asyncio.FIRST_COMPLETED)
        told = [news.result()] if news.done() else []
        news.cancel()
        while not self.queue.empty():
            told.append(self.queue.get_nowait())
        return told


def _extended(tokens: list[list[int]], told: list[tuple[int, list[int]]]) -> list[int]:
    """Each choice's tokens extended by what the decoder told (choice, new tokens); the
    choices that grew."""
    grew: list[int] = []
    for i, new in told:
        tokens[i] += new
        if new and i not in grew:
            grew.append(i)
    return grew


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


def _piece(index: int, text: str) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": None}
