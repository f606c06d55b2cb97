"""Server-sent events as OpenAI streams them, and a response's text as its tokens come.

A stream is ``data: <JSON chunk>`` events, one blank line after each, ended by
``data: [DONE]``. :class:`TextDeltas` gives the text of a response while it is decoded,
never a character that may not stay in it: the start of a stop text (the text returned
stops before one) and a character whose bytes have not all been sampled wait until the
next token tells. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["DONE", "TextDeltas", "event"]

DONE = b"data: [DONE]\n\n"
_PARTIAL = "\ufffd"  # what decoding shows of a character whose bytes are not all there


def event(chunk: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``chunk``."""
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


class TextDeltas:
    """The text not given yet of a response decoded so far (:meth:`add`), and at its end
    the rest of its final text (:meth:`finish`)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stop_texts: Sequence[str]) -> None:
        self.decode, self.stop_texts = decode, tuple(stop_texts)
        self.sent = ""

    def add(self, tokens: Sequence[int]) -> str:
        """The new text of the response ``tokens`` (every token so far)."""
        return self._give(self._safe(self.decode(tokens)))

    def finish(self, text: str) -> str:
        """What is left of ``text``, the response's final text, to give."""
        return self._give(text)

    def _give(self, text: str) -> str:
        if not text.startswith(self.sent):  # decoding more tokens rewrote what was given
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new

    def _safe(self, text: str) -> str:
        """``text`` without what may not stay: from a stop text on, or the end of it that
        a stop text may start with, and a partial character at its end."""
        found = [text.find(t) for t in self.stop_texts if t in text]
        if found:
            return text[: min(found)]
        held = max((_overlap(text, t) for t in self.stop_texts), default=0)
        text = text[: len(text) - held]
        return text.rstrip(_PARTIAL) if text.endswith(_PARTIAL) else text


def _overlap(text: str, stop: str) -> int:
    """The length of the longest end of ``text`` that ``stop`` starts with (not all of it)."""
    for size in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:size]):
            return size
    return 0
