"""A response's text given as its tokens come: never a character that may not stay."""

from __future__ import annotations

import json

from asyncrl.actors.serving.streaming import DONE, TextDeltas, event


def chars(ids: list[int]) -> str:
    """A decode of one character per id (0 stands for half a character's bytes)."""
    return "".join("\ufffd" if i == 0 else chr(i) for i in ids)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_text_comes_as_decoded_and_the_rest_at_the_end() -> None:
    deltas = TextDeltas(chars, ())
    assert deltas.add(ids("12")) == "12"
    assert deltas.add(ids("123")) == "3"
    assert deltas.add([*ids("123"), 0]) == ""  # half a character: it waits
    assert deltas.finish("1234") == "4"


def test_what_may_start_a_stop_text_waits_and_a_stop_text_is_never_given() -> None:
    deltas = TextDeltas(chars, ("+0=",))
    assert deltas.add(ids("45+")) == "45"  # "+" may open "+0="
    assert deltas.add(ids("45+1")) == "+1"  # it did not
    assert deltas.add(ids("45+1+0")) == ""
    assert deltas.add(ids("45+1+0=7")) == ""  # the stop text and what follows: never
    assert deltas.finish("45+1") == ""  # the final text stops before it: all given


def test_events_are_openai_server_sent_events() -> None:
    raw = event({"choices": [], "usage": {"total_tokens": 3}})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    assert json.loads(raw[6:]) == {"choices": [], "usage": {"total_tokens": 3}}
    assert DONE == b"data: [DONE]\n\n"
