"""Exact token ids across a chat session's turns.

A chat call's prompt is its messages as the model's chat template renders them, encoded.
An agent's next call sends those messages again, then the assistant message it got back,
then its own (a tool's result, the next user turn). Rendering and encoding all of that
again does not give back the ids the model sampled: the template writes a tool call its
own way (key order, spacing), and a byte-pair tokenizer merges the answer's text into
other tokens than the ones sampled one at a time. The trainer would then train on a
context the model never read, and the calls would not extend one another, so each would
train as a sequence of its own (:mod:`.merge`).

:class:`ChatTurns` remembers, per session, each chat call: its messages, its tools, its
prompt ids, the ids it sampled and the assistant message it returned. A later call whose
messages are an earlier call's messages followed by the message that call returned is
spliced onto it: its prompt is that call's prompt ids and sampled ids, then the ids of
what the template renders after the assistant's turn (the part of the turn's closing the
model did not write itself, the new messages, the generation prompt). A session whose
calls all splice trains as one sequence of exactly the ids the model read and wrote.

A call is rendered afresh instead (in training: a new sequence) when no earlier call of
the session is a prefix of it (a new conversation), or when a splice would not be what
the template means: the messages change the message returned, the tools differ, or the
template does not render the conversation as a prefix of its continuation (one that
drops earlier turns' reasoning, say). Each such fall back is counted by its reason, and
each reason logged once.

A session is forgotten when its records are taken, ``ttl_s`` after its last call, or
(the least recently used first) beyond ``max_sessions``; it keeps its latest
``max_calls`` calls.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from ..policy.chat_template import ChatTemplate, ChatTemplateError
from ..policy.tokenizer import TextCodec

__all__ = ["ChatPrompt", "ChatTurns"]

log = structlog.get_logger("asyncrl.serving")

# An assistant message's content that no conversation holds: where the template puts
# the content shows what it writes after it (how it closes an assistant turn).
_PROBE = "\x00closing-probe\x00"


@dataclass(frozen=True)
class ChatPrompt:
    """A chat call's prompt: its token ids and what a later call is compared with."""

    ids: list[int]
    messages: tuple[str, ...]  # each message in a canonical form (_message_key)
    tools: str  # the tools offered, in a canonical form
    spliced: bool  # extends an earlier call of the session exactly


@dataclass(frozen=True)
class _Call:
    """A call remembered: enough to splice a later one onto it."""

    messages: tuple[str, ...]
    tools: str
    ids: array  # its prompt's ids, then the ids it sampled (the ending one included)
    reply: str  # the assistant message returned, in canonical form
    content: str  # that message's text
    ended_by: int | None  # the end or stop token id that ended it; None: a stop text or length


class _NotSpliced(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class ChatTurns:
    """Sessions' chat calls, to give a later call of a session its exact prompt ids.
    Safe to use from any thread."""

    def __init__(
        self,
        template: ChatTemplate,
        codec: TextCodec,
        *,
        ttl_s: float,
        max_sessions: int = 1024,
        max_calls: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.template, self.codec = template, codec
        self.ttl_s, self.max_sessions, self.max_calls = ttl_s, max_sessions, max_calls
        self.clock = clock
        self.spliced = 0  # calls that extend an earlier call exactly
        self.fell_back: Counter[str] = Counter()  # calls rendered afresh, by reason
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, deque[_Call]] = OrderedDict()  # oldest use first
        self._touched: dict[str, float] = {}

    def prompt(
        self,
        session: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ChatPrompt:
        """The prompt of a call of ``session``: spliced onto the earlier call it extends,
        else the template's rendering encoded. ChatTemplateError if the template cannot
        render ``messages``."""
        text = self.template.render(messages, tools=tools)
        keys = tuple(_message_key(m) for m in messages)
        tools_key = _tools_key(tools)
        with self._lock:
            self._sweep()
            calls = list(self._sessions.get(session, ()))
        ids = self._splice(calls, messages, keys, tools, tools_key, text)
        if ids is not None:
            return ChatPrompt(ids, keys, tools_key, spliced=True)
        return ChatPrompt(self.codec.encode(text), keys, tools_key, spliced=False)

    def remember(
        self,
        session: str,
        prompt: ChatPrompt,
        completion_ids: Sequence[int],
        reply: Mapping[str, Any],
        ended_by: int | None,
    ) -> None:
        """A call of ``session`` answered: ``prompt`` sampled ``completion_ids`` (the
        ending token included), returned as the assistant message ``reply``, ended by the
        token ``ended_by`` (None: by a stop text or the length limit)."""
        call = _Call(
            prompt.messages,
            prompt.tools,
            array("i", [*prompt.ids, *completion_ids]),
            _message_key(reply),
            _content(reply.get("content")),
            ended_by,
        )
        with self._lock:
            self._sweep()
            calls = self._sessions.get(session)
            if calls is None:
                calls = self._sessions[session] = deque(maxlen=self.max_calls)
            self._sessions.move_to_end(session)
            calls.append(call)
            self._touched[session] = self.clock()
            while len(self._sessions) > self.max_sessions:
                oldest, _ = self._sessions.popitem(last=False)
                del self._touched[oldest]

    def forget(self, session: str) -> None:
        with self._lock:
            self._sessions.pop(session, None)
            self._touched.pop(session, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    # --- splicing -------------------------------------------------------------------------

    def _splice(
        self,
        calls: list[_Call],
        messages: Sequence[Mapping[str, Any]],
        keys: tuple[str, ...],
        tools: Sequence[Mapping[str, Any]] | None,
        tools_key: str,
        text: str,
    ) -> list[int] | None:
        """The spliced prompt ids, or None: a new conversation, or a fall back (counted)."""
        continued: _Call | None = None  # the earlier call with most turns this one repeats
        extended: _Call | None = None  # ... and whose returned message follows them
        for call in reversed(calls):  # the latest first: it wins a tie
            turns = len(call.messages)
            if turns >= len(keys) or keys[:turns] != call.messages:
                continue
            if continued is None or turns > len(continued.messages):
                continued = call
            if keys[turns] == call.reply and (extended is None or turns > len(extended.messages)):
                extended = call
        if continued is None:
            return None
        try:
            if extended is None:
                raise _NotSpliced(
                    "reply", "the messages change the assistant message the server returned"
                )
            if extended.tools != tools_key:
                raise _NotSpliced("tools", "the tools offered differ from the earlier call's")
            after = self._after_turn(messages, len(extended.messages), tools, text, extended)
        except _NotSpliced as why:
            self._fall_back(why)
            return None
        with self._lock:
            self.spliced += 1
        return [*extended.ids, *self.codec.encode(after)] if after else list(extended.ids)

    def _after_turn(
        self,
        messages: Sequence[Mapping[str, Any]],
        turns: int,
        tools: Sequence[Mapping[str, Any]] | None,
        text: str,
        call: _Call,
    ) -> str:
        """The text the template renders after the assistant's turn ``messages[turns]``
        that the model did not write: the rest of the turn's closing, the new messages,
        the generation prompt. _NotSpliced if the template's rendering is not one."""
        before = self._render(messages[:turns], tools, generation=True)
        through = self._render(messages[: turns + 1], tools, generation=False)
        if not (through.startswith(before) and text.startswith(through)):
            raise _NotSpliced(
                "not prefix-stable",
                "the chat template does not render the conversation so far as the start "
                "of its continuation (it renders earlier turns differently once more follow)",
            )
        turn = through[len(before) :]
        probe = self._render(
            [*messages[:turns], {"role": "assistant", "content": _PROBE}], tools, generation=False
        )
        if not probe.startswith(before) or _PROBE not in probe[len(before) :]:
            raise _NotSpliced(
                "closing", "the chat template does not render an assistant message's content"
            )
        closing = probe.rpartition(_PROBE)[2]
        if not turn.endswith(closing):
            raise _NotSpliced(
                "closing",
                f"the chat template closes this assistant turn otherwise than with "
                f"{closing!r}, its closing of a plain one",
            )
        written = call.content.strip()
        if written and written not in turn:
            raise _NotSpliced(
                "content",
                "the chat template leaves out or rewrites part of the text the model wrote "
                "(earlier reasoning, say)",
            )
        return self._unwritten(closing, call.ended_by) + text[len(through) :]

    def _unwritten(self, closing: str, ended_by: int | None) -> str:
        """The part of an assistant turn's ``closing`` the model did not write: what
        follows the end token it stopped on, when the closing opens with it (Qwen's
        ``<|im_end|>`` then ``\\n``; Llama 2's `` </s>``, whose space the model does not
        write), or all of it after a stop text, the length limit or another token."""
        if ended_by is None:
            return closing
        end = self.codec.tokenizer.decode([ended_by], skip_special_tokens=False)
        opening = closing.lstrip()
        return opening[len(end) :] if end and opening.startswith(end) else closing

    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        generation: bool,
    ) -> str:
        try:
            return self.template.render(messages, tools=tools, add_generation_prompt=generation)
        except ChatTemplateError as error:
            detail = f"the chat template cannot render a part of the conversation: {error}"
            raise _NotSpliced("not renderable", detail) from None

    def _fall_back(self, why: _NotSpliced) -> None:
        with self._lock:
            self.fell_back[why.reason] += 1
            first = self.fell_back[why.reason] == 1
        if first:  # once per reason: a harness repeats itself
            log.warning(
                "a chat call continuing a session was rendered afresh, so it trains as a "
                "new sequence",
                reason=why.reason,
                why=str(why),
            )

    def _sweep(self) -> None:
        cutoff = self.clock() - self.ttl_s
        for session in [s for s, at in self._touched.items() if at < cutoff]:
            del self._sessions[session], self._touched[session]


def _message_key(message: Mapping[str, Any]) -> str:
    """``message`` in a canonical form: its content as text, its tool calls by id, name
    and parsed arguments, without empty fields: an OpenAI client sends an assistant message
    back with every field of its type, those the server left out as None (``refusal``,
    ``audio``, ``function_call``, ``annotations``) or empty."""
    canonical: dict[str, Any] = {}
    for name, value in message.items():
        if name != "content" and (value is None or value in ("", [], {})):
            continue
        if name == "content":
            value = _content(value)
        elif name == "tool_calls" and isinstance(value, list):
            value = [_tool_call(c) for c in value]
        canonical[name] = value
    canonical.setdefault("content", "")
    return json.dumps(canonical, sort_keys=True, default=str)


def _content(content: object) -> str:
    """A message's content as text: a list of text parts joined, None as nothing."""
    if content is None:
        return ""
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else p for p in content]
        return "".join(p if isinstance(p, str) else json.dumps(p, default=str) for p in parts)
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _tool_call(call: object) -> object:
    if not isinstance(call, dict):
        return call
    function = call.get("function") or {}
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # else compared as the text it is
            arguments = json.loads(arguments)
    name = function.get("name") if isinstance(function, dict) else None
    return {"id": call.get("id"), "name": name, "arguments": arguments}


def _tools_key(tools: Sequence[Mapping[str, Any]] | None) -> str:
    return json.dumps(list(tools or []), sort_keys=True, default=str)
