"""Exact tokens across a chat session's turns (actors/serving/chat_turns.py): a later call
that repeats an earlier one and the message it returned is spliced onto the ids sampled,
never a re-tokenisation of the text; against real chat templates and a byte-pair
tokenizer whose re-tokenisation differs from what was sampled."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from structlog.testing import capture_logs
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from asyncrl.actors.policy.chat_template import ChatTemplate
from asyncrl.actors.policy.directories import EMBEDDED_DIR
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.serving.call_records import CallRecord
from asyncrl.actors.serving.chat_turns import ChatPrompt, ChatTurns
from asyncrl.actors.serving.merge import merge_calls
from tests.support.chat_templates import QWEN_STYLE

# As Qwen3's: an assistant turn's reasoning is shown only after the last user message,
# so a new user message drops the earlier turns' reasoning.
DROPS_REASONING = """
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
  {%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif -%}
{%- endfor -%}
{%- for message in messages -%}
  {%- if message.role == 'assistant' and loop.index0 < ns.last_user -%}
    {{- '<|im_start|>assistant\\n' + message.content.split('</think>')[-1] + '<|im_end|>\\n' }}
  {%- else -%}
    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{% endif %}
"""

# Leaves every assistant turn's reasoning out, whatever follows.
STRIPS_REASONING = DROPS_REASONING.replace("loop.index0 < ns.last_user", "true")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "The sum of two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Merges a byte-pair tokenizer learned: the tool's name, and a number's digits, are one
# token each when text is encoded, however the model sampled them.
MERGES = [("a", "d"), ("ad", "d"), ("4", "2"), ("1", "2"), ("Ġ", "4"), ("Ġ", "2")]


def bpe_codec() -> TextCodec:
    """A byte-level BPE tokenizer as Qwen's and GPT-2's are, small: every byte, a few
    merges, ChatML's special tokens (the end of a turn, <|im_end|>, ends a response)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    for left, right in MERGES:
        vocab[left + right] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab, MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    end, pad = tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")
    return TextCodec(tokenizer, end, pad, eos_ids=[pad])


def template(source: str) -> ChatTemplate:
    return ChatTemplate(source, {"eos_token": "<|im_end|>"}, "a test template")


def one_byte_at_a_time(codec: TextCodec, text: str) -> list[int]:
    """``text`` as a model samples it token by token here: each byte its own token."""
    ids = []
    for char in text:
        (token,) = codec.encode(char)
        ids.append(token)
    return ids


def tool_call(call_id: str, name: str, arguments: dict) -> dict:
    """A tool call as the server returns it (arguments as JSON text)."""
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def assistant(content: str | None, *calls: dict) -> dict:
    """The assistant message the server returns: its text, and its tool calls if any."""
    return {
        "role": "assistant",
        "content": content,
        **({"tool_calls": list(calls)} if calls else {}),
    }


def said(codec: TextCodec, text: str) -> list[int]:
    """The ids a model sampled writing ``text`` then ending its turn (<|im_end|>)."""
    return [*one_byte_at_a_time(codec, text), codec.eos_id]


def echoed(reply: dict) -> dict:
    """``reply`` as an openai client sends it back (``message.model_dump()``): every
    field of its type, the ones the server left out as None."""
    nulls = {"refusal": None, "audio": None, "function_call": None, "annotations": None}
    return {"content": None, "tool_calls": None, **nulls, **reply}


@dataclass
class Session:
    """A harness's chat session against ChatTurns, recorded as the server records it."""

    turns: ChatTurns
    name: str = "s-0"
    messages: list[dict] = field(default_factory=list)
    records: list[CallRecord] = field(default_factory=list)
    prompts: list[ChatPrompt] = field(default_factory=list)

    def call(
        self, sampled: list[int], reply: dict, *, ended_by: int | None, tools: Any = TOOLS
    ) -> ChatPrompt:
        """One call of the session's messages so far: ``sampled`` is what the model wrote,
        ``reply`` the assistant message returned, which the harness then appends."""
        prompt = self.turns.prompt(self.name, self.messages, tools)
        self.turns.remember(self.name, prompt, sampled, reply, ended_by)
        logprobs = [-0.25] * len(sampled)
        self.records.append(CallRecord(prompt.ids, sampled, logprobs, [7] * len(sampled), False))
        self.prompts.append(prompt)
        self.messages.append(echoed(reply))
        return prompt


def test_a_tool_using_session_over_four_turns_trains_as_one_sequence_of_sampled_ids() -> None:
    codec = bpe_codec()
    chat = template(QWEN_STYLE)
    turns = ChatTurns(chat, codec, ttl_s=60)
    end = codec.eos_id
    session = Session(turns, messages=[{"role": "user", "content": "What is 42+12, plus 2?"}])

    # Turn 1: a tool call written the model's way (no spaces), each byte a token.
    wrote = [
        '<tool_call>\n{"name":"add","arguments":{"a":42,"b":12}}\n</tool_call>',
        'Now add 2.\n<tool_call>\n{"arguments":{"b":2,"a":54},"name":"add"}\n</tool_call>',
        "It is 56: 42+12+2.",
        "Yes: 42 and 12 add up to 54.",
    ]
    sampled = [said(codec, text) for text in wrote]
    replies = [
        assistant(None, tool_call("call_1", "add", {"a": 42, "b": 12})),
        assistant("Now add 2.", tool_call("call_2", "add", {"b": 2, "a": 54})),
        assistant("It is 56: 42+12+2."),
        assistant("Yes: 42 and 12 add up to 54."),
    ]
    after = [
        {"role": "tool", "tool_call_id": "call_1", "content": "54"},
        {"role": "tool", "tool_call_id": "call_2", "content": "56"},
        {"role": "user", "content": "Was the first sum 54?"},
    ]
    for i, reply in enumerate(replies):
        session.call(sampled[i], reply, ended_by=end)
        if i < len(after):
            session.messages.append(after[i])

    # Encoding the text again would not give the ids sampled: the premise.
    for ids in sampled:
        assert codec.encode(codec.tokenizer.decode(ids, skip_special_tokens=False)) != ids
    assert [p.spliced for p in session.prompts] == [False, True, True, True]
    assert turns.spliced == 3 and not turns.fell_back

    # Each spliced prompt: the previous prompt, what was sampled, then exactly the text the
    # template renders after that assistant turn (its "\n" after <|im_end|>, the new
    # message, the generation prompt), encoded.
    for i in range(1, 4):
        previous, prompt = session.prompts[i - 1], session.prompts[i]
        kept = [*previous.ids, *sampled[i - 1]]
        assert prompt.ids[: len(kept)] == kept
        between = codec.tokenizer.decode(prompt.ids[len(kept) :], skip_special_tokens=False)
        full = chat.render(session.messages[: 2 * i + 1], tools=TOOLS)
        through = chat.render(session.messages[: 2 * i], tools=TOOLS, add_generation_prompt=False)
        assert between == "\n" + full[len(through) :]
        assert between.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # ... where the template's own rendering, encoded, is other ids.
    last = session.prompts[-1]
    assert codec.encode(chat.render(session.messages[:-1], tools=TOOLS)) != last.ids

    # The session trains as ONE sequence: the model's tokens trained, the rest not.
    (sequence,) = merge_calls(session.records, owner=2)
    assert list(sequence.tokens) == [*last.ids, *sampled[-1]]
    trained = [False] * len(sequence.tokens)
    for prompt, ids in zip(session.prompts, sampled, strict=True):
        for at in range(len(prompt.ids), len(prompt.ids) + len(ids)):
            trained[at] = True
    assert list(sequence.trained) == trained
    assert [v for v, t in zip(sequence.versions, trained, strict=True) if t] == [7] * sum(
        map(len, sampled)
    )
    assert sum(sequence.trained) == sum(map(len, sampled))


def test_a_turn_ended_by_a_stop_text_or_the_length_limit_is_closed_by_the_template() -> None:
    codec = bpe_codec()
    turns = ChatTurns(template(QWEN_STYLE), codec, ttl_s=60)
    session = Session(turns, messages=[{"role": "user", "content": "Add 4 and 2."}])
    # stop=["</tool_call>"]: the model wrote the stop text and no end token.
    wrote = '<tool_call>\n{"name":"add","arguments":{"a":4,"b":2}}\n</tool_call>'
    sampled = one_byte_at_a_time(codec, wrote)
    reply = assistant(None, tool_call("call_9", "add", {"a": 4, "b": 2}))
    first = session.call(sampled, reply, ended_by=None)
    session.messages.append({"role": "tool", "tool_call_id": "call_9", "content": "6"})
    # max_tokens=1: the length limit ended it.
    second = session.call(one_byte_at_a_time(codec, "6"), assistant("6"), ended_by=None)

    kept = [*first.ids, *sampled]
    assert second.spliced and second.ids[: len(kept)] == kept
    between = codec.tokenizer.decode(second.ids[len(kept) :], skip_special_tokens=False)
    assert between.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n6\n")
    (sequence,) = merge_calls(session.records, owner=0)
    assert sum(sequence.trained) == len(sampled) + 1


def test_turns_sampled_as_the_template_would_write_them_splice_to_its_rendering() -> None:
    # No drift: the model wrote each turn's text in the tokens its encoding gives and
    # ended it with <|im_end|>. The spliced prompts are then the template's rendering of
    # the whole conversation, encoded: one uninterrupted generation's.
    codec = bpe_codec()
    chat = template(QWEN_STYLE)
    turns = ChatTurns(chat, codec, ttl_s=60)
    session = Session(turns, messages=[{"role": "user", "content": "What is 42+12?"}])
    for text, then in [("Let me see.", "Go on."), ("It is 54.", "Sure?"), ("Yes.", "")]:
        session.call([*codec.encode(text), codec.eos_id], assistant(text), ended_by=codec.eos_id)
        session.messages.append({"role": "user", "content": then})
    for prompt, end in zip(session.prompts, [1, 3, 5], strict=True):
        assert prompt.ids == codec.encode(chat.render(session.messages[:end], tools=TOOLS))
    assert [p.spliced for p in session.prompts] == [False, True, True]


@pytest.mark.parametrize("end", ["<|endoftext|>", "\n"])
def test_an_end_token_the_closing_does_not_open_with_leaves_all_of_it(end: str) -> None:
    # <|endoftext|>: an end-of-sequence id the template never writes; "\n": a call's
    # stop_token_ids. The model wrote it; the template's closing follows whole.
    codec = bpe_codec()
    turns = ChatTurns(template(QWEN_STYLE), codec, ttl_s=60)
    session = Session(turns, messages=[{"role": "user", "content": "Hi."}])
    (end_id,) = codec.encode(end)
    sampled = [*one_byte_at_a_time(codec, "Hello."), end_id]
    first = session.call(sampled, assistant("Hello."), ended_by=end_id, tools=None)
    session.messages.append({"role": "user", "content": "Bye."})
    second = turns.prompt(session.name, session.messages, None)
    kept = [*first.ids, *sampled]
    assert second.spliced and second.ids[: len(kept)] == kept
    between = codec.tokenizer.decode(second.ids[len(kept) :], skip_special_tokens=False)
    assert between == "<|im_end|>\n<|im_start|>user\nBye.<|im_end|>\n<|im_start|>assistant\n"


def test_the_embedded_models_template_splices_to_its_own_rendering() -> None:
    # One token per character and a turn closed by the end token: the splice of a turn the
    # model ended gives the very ids of the template's rendering; one cut by a stop text
    # keeps the stop text the model wrote, then the template's end token.
    codec, chat = TextCodec.from_dir(EMBEDDED_DIR), ChatTemplate.from_dir(EMBEDDED_DIR)
    turns = ChatTurns(chat, codec, ttl_s=60)
    session = Session(turns, messages=[{"role": "user", "content": "12+30="}])
    end = codec.eos_id
    first = session.call([*codec.encode("42"), end], assistant("42"), ended_by=end, tools=None)
    session.messages.append({"role": "user", "content": ";42*2="})
    # stop=[";"]: the text returned stops before it.
    second = session.call(codec.encode("84;"), assistant("84"), ended_by=None, tools=None)
    session.messages.append({"role": "user", "content": "84+1="})
    third = session.call([*codec.encode("85"), end], assistant("85"), ended_by=end, tools=None)

    assert second.spliced and third.spliced
    assert second.ids == codec.encode(chat.render(session.messages[:3]))
    assert third.ids == [*second.ids, *codec.encode("84;"), codec.eos_id, *codec.encode("84+1=")]
    assert third.ids != codec.encode(chat.render(session.messages[:5]))  # that drops the ";"
    (sequence,) = merge_calls(session.records, owner=0)
    assert list(sequence.tokens) == [*third.ids, *codec.encode("85"), codec.eos_id]
    assert sum(sequence.trained) == 3 + 3 + 3
    assert first.ids == codec.encode("12+30=")


def test_what_a_client_adds_to_a_message_it_sends_back_is_not_a_change() -> None:
    codec = bpe_codec()
    turns = ChatTurns(template(QWEN_STYLE), codec, ttl_s=60)
    session = Session(turns, messages=[{"role": "user", "content": "Add."}])
    reply = assistant("", tool_call("call_1", "add", {"a": 1, "b": 2}))
    session.call(said(codec, "<tool_call>"), reply, ended_by=codec.eos_id)
    # Sent back its own way: arguments spaced otherwise, content None, empty fields.
    call = {"id": "call_1", "type": "function"}
    call["function"] = {"name": "add", "arguments": '{"b":2, "a":1}'}
    session.messages[-1] = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "annotations": [],
        "tool_calls": [call],
    }
    session.messages.append({"role": "tool", "tool_call_id": "call_1", "content": "3"})
    assert turns.prompt(session.name, session.messages, TOOLS).spliced


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("content", "reply"),  # the harness rewrote what the model answered
        ("call id", "reply"),
        ("tools", "tools"),
    ],
)
def test_a_call_that_changes_the_earlier_turn_is_rendered_afresh_and_counted(
    change: str, reason: str
) -> None:
    codec = bpe_codec()
    chat = template(QWEN_STYLE)
    turns = ChatTurns(chat, codec, ttl_s=60)
    session = Session(turns, messages=[{"role": "user", "content": "Add."}])
    reply = assistant("Sure.", tool_call("call_1", "add", {"a": 1, "b": 2}))
    session.call(said(codec, "Sure."), reply, ended_by=codec.eos_id)
    tools: list | None = TOOLS
    if change == "content":
        session.messages[-1]["content"] = "Sure!"
    elif change == "call id":
        session.messages[-1]["tool_calls"] = [tool_call("call_7", "add", {"a": 1, "b": 2})]
    else:
        tools = None
    session.messages.append({"role": "tool", "tool_call_id": "call_1", "content": "3"})

    with capture_logs() as logs:
        prompt = turns.prompt(session.name, session.messages, tools)
        assert turns.prompt(session.name, session.messages, tools) == prompt
    assert not prompt.spliced
    assert prompt.ids == codec.encode(chat.render(session.messages, tools=tools))
    assert turns.fell_back == {reason: 2} and turns.spliced == 0
    (logged,) = logs  # once per reason
    assert logged["reason"] == reason and "rendered afresh" in logged["event"]


@pytest.mark.parametrize(
    ("source", "reason"), [(DROPS_REASONING, "not prefix-stable"), (STRIPS_REASONING, "content")]
)
def test_a_template_that_drops_earlier_reasoning_is_not_spliced(source: str, reason: str) -> None:
    codec = bpe_codec()
    turns = ChatTurns(template(source), codec, ttl_s=60)
    session = Session(turns, messages=[{"role": "user", "content": "Hi."}])
    text = "<think>greet</think>Hello."
    session.call(said(codec, text), assistant(text), ended_by=codec.eos_id, tools=None)
    session.messages.append({"role": "user", "content": "Bye."})
    assert not turns.prompt(session.name, session.messages, None).spliced
    assert turns.fell_back == {reason: 1}


def test_a_new_conversation_is_no_fall_back_and_the_latest_longest_match_wins() -> None:
    codec = bpe_codec()
    turns = ChatTurns(template(QWEN_STYLE), codec, ttl_s=60)
    end = codec.eos_id
    user = {"role": "user", "content": "Say a word."}
    first = turns.prompt("s", [user])
    assert not first.spliced
    # Two choices (n=2) of one call: the next call continues the one it sends back.
    words = {"yes": said(codec, "yes"), "no": said(codec, "no")}
    for word, ids in words.items():
        turns.remember("s", first, ids, assistant(word), end)
    again = {"role": "user", "content": "Again."}
    second = turns.prompt("s", [user, assistant("no"), again])
    assert second.ids[: len(first.ids) + 3] == [*first.ids, *words["no"]]
    turns.remember("s", second, words["yes"], assistant("yes"), end)
    third = turns.prompt("s", [user, assistant("no"), again, assistant("yes"), again])
    assert third.ids[: len(second.ids) + 4] == [*second.ids, *words["yes"]]
    assert turns.prompt("s", [{"role": "user", "content": "Something else."}]).spliced is False
    assert turns.spliced == 2 and not turns.fell_back


def test_sessions_are_forgotten_when_taken_after_their_time_and_beyond_the_bound() -> None:
    codec = bpe_codec()
    now = [0.0]
    turns = ChatTurns(
        template(QWEN_STYLE), codec, ttl_s=10, max_sessions=2, max_calls=2, clock=lambda: now[0]
    )
    user = {"role": "user", "content": "Hi."}
    reply = assistant("Hello.")
    sampled = said(codec, "Hello.")

    def answered(session: str) -> None:
        turns.remember(session, turns.prompt(session, [user]), sampled, reply, codec.eos_id)

    def continues(session: str) -> bool:
        return turns.prompt(session, [user, reply, {"role": "user", "content": "Bye."}]).spliced

    for session in ("a", "b", "c"):
        answered(session)
    assert len(turns) == 2 and not continues("a") and continues("b")  # "a": the oldest
    turns.forget("b")
    assert not continues("b")
    now[0] = 11.0
    assert not continues("c") and len(turns) == 0
    for _ in range(3):  # a session keeps its latest calls only
        answered("d")
    assert continues("d") and len(turns._sessions["d"]) == 2
