"""A chat or completion request's body, checked, as the call the decoder serves.

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
ignored, as OpenAI's API does. A greedy session's call decodes greedily whatever
sampling it names.

``n`` choices are decoded together; with a ``seed`` choice i draws from seed + i, so the
same seed, prompt and weights give the same choices whatever other calls share the
decoder's steps. ``max_tokens`` (or ``max_completion_tokens``) is capped to the
decoder's ``model.max_new_tokens``; a prompt longer than ``model.max_prompt_tokens`` is
refused. A call's own ``stop`` texts end its response once it holds one (its text is cut
before them, in api_replies.py), and so do the run's ``algorithm.stop`` texts (the
decoder's; the text is not cut before those); ``stop_token_ids`` end it at those tokens.

Chat: ``tools`` (OpenAI's function definitions) reach the model through its chat
template, unless ``tool_choice`` is ``none``; ``required`` or a named function is
checked against the tools but not enforced (no constrained decoding). Tools are refused
when no tool-call format is known (``model.tool_parser`` auto finding none in the
template); with ``model.tool_parser`` none they are offered and the response stays text.
A message's content may be text or a list of text parts; an assistant message's
``tool_calls`` go to the template with their arguments as objects (the client sends JSON
text; templates read objects); ``tool`` messages pass as they are. The prompt is the
template's rendering, encoded, or the ids of the session's earlier call it continues
(chat_turns.py). Completions: a prompt is one text, or token ids.

Everything refused is an :class:`~.api_errors.ApiError` naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from ..policy.chat_template import ChatTemplateError
from ..policy.decoder import Request as DecodeRequest
from ..policy.decoder import StopTexts
from ..policy.sampling import sampling_problem
from ..policy.tokenizer import TextCodec
from .api_errors import ApiError
from .chat_turns import ChatPrompt, ChatTurns

__all__ = ["ApiSettings", "Call", "RequestReader", "Tools", "json_body"]

_MAX_STOP_TEXTS = 4  # as OpenAI's API allows
_MAX_CHOICES = 128  # n, as OpenAI's API allows
# Fields that would change the distribution sampled in ways the records do not hold (the
# trainer recomputes log-probs of the model's own distribution), with their no-op value.
_UNRECORDED = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
}


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
    # model.tool_parser as configured: with no parser, "none" offers tools and reads no
    # calls, "auto" (no format found in the template) refuses them.
    tool_parser_setting: str = "auto"


@dataclass(frozen=True)
class Tools:
    """The tools a chat call offers the model, and whether its response is read for calls."""

    offered: list[dict[str, Any]] | None = None  # OpenAI's function definitions
    names: frozenset[str] = frozenset()
    parser: str | None = None  # None: the response is text


_NO_TOOLS = Tools()


@dataclass(frozen=True)
class Call:
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

    def stop_test(self, decode: Callable[[list[int]], str]) -> StopTexts | None:
        """The decoder's test of a response so far for the call's stop texts (run on its
        thread), the rule the run's own stop texts follow; None when it has none."""
        return StopTexts.of(self.stop_texts, decode)


async def json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        raise ApiError("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError("the request body is not a JSON object")
    return body


class RequestReader:
    """Request bodies read into calls, against what this generator serves; ``turns``:
    the chat sessions' earlier calls (None: the model has no chat template)."""

    def __init__(self, settings: ApiSettings, codec: TextCodec, turns: ChatTurns | None) -> None:
        self.settings, self.codec, self.turns = settings, codec, turns

    def chat(self, body: dict[str, Any], session: str, *, greedy: bool) -> tuple[Call, Tools]:
        """A chat request's call, and the tools it offers; ``session``: whose turns it may
        continue; ``greedy``: a greedy session's call."""
        tools = self._tools(body)
        logprobs = body.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise ApiError(f"logprobs: got {logprobs!r}; allowed: true or false", "logprobs")
        prompt = self._chat_prompt(body, tools.offered, session)
        call = self._call(body, prompt.ids, "messages", bool(logprobs), greedy)
        return dataclasses.replace(call, turn=(session, prompt)), tools

    def completion(self, body: dict[str, Any], *, greedy: bool) -> Call:
        """A completion request's call; ``greedy``: a greedy session's call."""
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
        return self._call(body, prompt, "prompt", wanted is not None, greedy)

    def _call(
        self, body: dict[str, Any], prompt: list[int], param: str, logprobs: bool, greedy: bool
    ) -> Call:
        """The sampling a request asks for; ApiError for what cannot be served exactly."""
        s = self.settings
        n = body.get("n", 1)
        if n is not None and not (_whole(n) and 1 <= n <= _MAX_CHOICES):
            raise ApiError(f"n: got {n!r}; allowed: an integer from 1 to {_MAX_CHOICES}", "n")
        _check_recordable(body)
        sampling: dict[str, Any] = {}
        picked = False
        if not greedy and s.sampling == "run":
            _check_run_sampling(body, s)
        elif not greedy:
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
                f"{param}: {len(prompt)} tokens; this generator takes at most "
                f"{s.max_prompt_tokens} (model.max_prompt_tokens)",
                param,
            )
        stream, include_usage = _stream_options(body)
        return Call(
            prompt, self._max_tokens(body), self._stop_ids(body), _stop_texts(body),
            logprobs, greedy=greedy or picked, recorded=not greedy, seed=seed,
            n=n or 1, sampling=sampling, stream=stream, include_usage=include_usage,
        )  # fmt: skip

    def _max_tokens(self, body: dict[str, Any]) -> int:
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        wanted = body.get(name)
        if wanted is None:
            return self.settings.max_new_tokens
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
            raise ApiError(f"{name}: got {wanted!r}; allowed: an integer >= 1", name)
        return min(wanted, self.settings.max_new_tokens)  # the decoder's cache holds no more

    def _stop_ids(self, body: dict[str, Any]) -> frozenset[int]:
        ids = body.get("stop_token_ids") or []
        if not isinstance(ids, list) or not all(self._token_id(i) for i in ids):
            raise ApiError("stop_token_ids: expected a list of token ids", "stop_token_ids")
        return frozenset(ids)

    def _tools(self, body: dict[str, Any]) -> Tools:
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
        if parser is None and self.settings.tool_parser_setting != "none":
            raise ApiError(
                "tools: not served: the model's chat template shows no tool-call format this "
                "server reads (model.tool_parser=auto); set model.tool_parser to hermes or "
                "llama3_json, or to none to offer tools and get the response as text",
                "tools",
            )
        # model.tool_parser none: offered, and the response is the text the model wrote.
        return Tools(list(tools), frozenset(names), parser)

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

    def _encoded(self, text: str, param: str) -> list[int]:
        ids = self.codec.encode(text)
        if not ids:
            raise ApiError(f"{param}: encodes to no tokens", param)
        return ids


# --- sampling --------------------------------------------------------------------------


def _check_recordable(body: dict[str, Any]) -> None:
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


def _check_run_sampling(body: dict[str, Any], s: ApiSettings) -> None:
    """ApiError unless the request samples as the run does (or names no sampling)."""
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


def _not_the_runs(name: str, got: object, runs: float) -> ApiError:
    return ApiError(
        f"{name}: got {got!r}; this run samples at algorithm.{name}={runs:g} (the trainer "
        "recomputes log-probs under it; data.harness_sampling is run), so leave it out or "
        "pass that",
        name,
    )


# --- stopping and streaming ------------------------------------------------------------


def _stop_texts(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    texts = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(texts, list)
        or len(texts) > _MAX_STOP_TEXTS
        or not all(isinstance(t, str) and t for t in texts)
    ):
        raise ApiError(
            f"stop: got {stop!r}; allowed: a non-empty text, or a list of up to {_MAX_STOP_TEXTS}",
            "stop",
        )
    return tuple(texts)


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


# --- tools and messages ----------------------------------------------------------------


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


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: object) -> bool:
    """An integer >= 0 (JSON's true and false are not counts)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
