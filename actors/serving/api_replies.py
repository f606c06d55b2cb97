"""What a finished call answers, in OpenAI's shapes: its choices, usage and log-probs.

A chat choice's message is the assistant's: its text, or, where ``model.tool_parser``
reads whole tool calls in it (tool_calls.py), ``tool_calls`` (arguments as JSON text, ids
``call_<hex>``) with ``finish_reason: "tool_calls"``; anything else stays text. A
completion's choice is its text. The text stops before the first of the call's ``stop``
texts it holds (as OpenAI's), while every token sampled stays in the record. Log-probs
are the sampled tokens' own (no alternatives: the decoder keeps the sampled token's
alone), each token's text with special tokens by name; the end token is among the
tokens, since it was sampled and is trained. Each choice also carries
``prompt_token_ids`` and ``token_ids`` (as vLLM's do), so a harness can send the next
prompt as those ids plus its own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..policy.decoder import Finished
from ..policy.tokenizer import TextCodec
from .api_requests import Call, Tools
from .tool_calls import parse_tool_calls

__all__ = ["MODEL_NAME", "Replies", "finish_reason", "header", "reply", "token_ids", "usage"]

MODEL_NAME = "policy"


class Replies:
    """The choices of a call's finished responses, their text as ``codec`` decodes it."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec

    def chat_choice(self, index: int, finished: Finished, call: Call, tools: Tools) -> dict:
        message, reason = self.assistant(self.text(finished, call), finished, tools)
        return {
            "index": index,
            "message": message,
            "logprobs": self.chat_logprobs(finished) if call.logprobs else None,
            "finish_reason": reason,
            **token_ids(call, finished),
        }

    def text_choice(self, index: int, finished: Finished, call: Call) -> dict:
        return {
            "index": index,
            "text": self.text(finished, call),
            "logprobs": self.text_logprobs(finished) if call.logprobs else None,
            "finish_reason": finish_reason(finished),
            **token_ids(call, finished),
        }

    def assistant(self, text: str, finished: Finished, tools: Tools) -> tuple[dict[str, Any], str]:
        """The assistant message of a response's text, and its finish reason: tool calls
        where the text makes whole ones, else the text."""
        parsed = None
        if tools.parser is not None:
            parsed = parse_tool_calls(tools.parser, text, tools.names)
        if parsed is None:
            return {"role": "assistant", "content": text}, finish_reason(finished)
        calls = [
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.calls
        ]  # fmt: skip
        return {"role": "assistant", "content": parsed.content, "tool_calls": calls}, "tool_calls"

    def chat_logprobs(self, finished: Finished) -> dict[str, Any]:
        content = [
            {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
            for tok, lp in zip(self._pieces(finished), finished.logprobs, strict=True)
        ]
        return {"content": content}

    def text_logprobs(self, finished: Finished) -> dict[str, Any]:
        pieces = self._pieces(finished)
        offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
        return {
            "tokens": pieces,
            "token_logprobs": list(finished.logprobs),
            "top_logprobs": None,
            "text_offset": offsets,
        }

    def text(self, finished: Finished, call: Call) -> str:
        """The response's text, up to the first stop text it holds (without it)."""
        text = self.codec.decode(finished.tokens)
        cuts = [text.find(t) for t in call.stop_texts if t in text]
        return text[: min(cuts)] if cuts else text

    def _pieces(self, finished: Finished) -> list[str]:
        """Each sampled token's own text (special tokens by name)."""
        tokenizer = self.codec.tokenizer
        return [tokenizer.decode([t], skip_special_tokens=False) for t in finished.tokens]


def reply(
    kind: str, body: dict[str, Any], choices: list[dict], call: Call, finished: Sequence[Finished]
) -> dict[str, Any]:
    """A whole reply of ``kind`` (chat.completion, text_completion) to ``body``."""
    return {**header(kind, body), "choices": choices, "usage": usage(call, finished)}


def header(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """What a reply (or each chunk of a stream) of ``kind`` starts with."""
    prefix = "chatcmpl" if kind.startswith("chat.") else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": body.get("model") or MODEL_NAME,
    }


def usage(call: Call, finished: Sequence[Finished]) -> dict[str, int]:
    completion = sum(len(f.tokens) for f in finished)
    return {
        "prompt_tokens": len(call.prompt),
        "completion_tokens": completion,
        "total_tokens": len(call.prompt) + completion,
    }


def token_ids(call: Call, finished: Finished) -> dict[str, list[int]]:
    return {"prompt_token_ids": list(call.prompt), "token_ids": list(finished.tokens)}


def finish_reason(finished: Finished) -> str:
    return "length" if finished.truncated else "stop"
