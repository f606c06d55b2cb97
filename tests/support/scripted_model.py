"""Models that write what a test tells them to: chat models for tests of tool calls.

Their weights make a table of which token follows which (a bigram model): every layer's
attention and MLP write nothing back (their output projections are zero), so the last
position's logits depend on its own token alone, and the output layer maps each token of
a script to the next one by a margin that leaves every other token no probability at
temperature 1. A script is a list of pieces, each one token of the tokenizer (added whole
to a one-character-per-token tokenizer), none twice: after its dialect's cue (the last
token of the chat template's generation prompt) the model writes the script, then its
end token; after any other token, its end token. Another script is another set of
weights (:func:`script_state`), loaded into a running decoder as any new version is.

Two dialects (:class:`Dialect`), each a chat template with the tokens it needs:

- :data:`HERMES`: a Hermes-style template of its own (ChatML turns, tools listed as JSON
  in a system turn, calls in ``<tool_call>`` blocks, tool results in
  ``<tool_response>``), the generation prompt one token (the cue), the pieces of
  :data:`PIECES` as plain tokens, and an end token the template never writes.
- :data:`QWEN`: Qwen 2.5's way (chat_templates.py), ``<|im_start|>`` and ``<|im_end|>``
  special tokens and ``<|im_end|>`` the end token, as the template closes each turn
  with it; the cue is the newline that ends the generation prompt and the one piece is
  :data:`TOOL_CALL`, a call written compactly (the template writes it with spaces).
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from asyncrl.actors.policy.checkpoint import save_model
from asyncrl.actors.policy.model import CausalLM, ModelConfig
from asyncrl.actors.policy.tokenizer import EOS, build_char_tokenizer, write_tokenizer_files
from tests.support.chat_templates import QWEN_STYLE

GENERATION_PROMPT = "<|im_start|>assistant\n"
# Pieces the tests' scripts are made of (one token each), beside the template's markers.
PIECES = (
    "<|im_start|>",
    "<|im_end|>",
    "Let me work it out.",
    "\n<tool_call>\n",
    "<tool_call>\n",
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    '{"name": "mul", "arguments": {"a": 3, "b": 4}}',
    '{"name": "add", "arguments": {"a": 1,',  # broken JSON
    '{"name": "sub", "arguments": {}}',  # a function not offered
    "\n</tool_call>\n",
    "\n</tool_call>",
    '{"name": "add", "parameters": {"a": 1, "b": 2}}',  # Llama 3's JSON calls
    "; ",
    '{"name": "mul", "parameters": {"a": 3, "b": 4}}',
    "The ",
    "answer ",
    "is ",
    "3.",
)
# The Qwen-style model's own spelling of its call, compact: the template writes it with
# spaces.
TOOL_CALL = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'
TOOL_CALL_ARGUMENTS = {"a": 1, "b": 2}
# The tool that call calls, as a chat request offers it.
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "The sum of a and b.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        },
    },
}
END = "<|im_end|>"
_ALPHABET = "".join(c for c in string.printable if c not in "\r\x0b\x0c")
_HIDDEN = 256
_MARGIN = 20.0  # the next token's weight: its logit is this times sqrt(_HIDDEN)

HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call functions. Their signatures:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call one as <tool_call>
{"name": <name>, "arguments": <object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == "assistant" %}<|im_start|>assistant
{{ message.content }}
{%- for call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


@dataclass(frozen=True)
class Dialect:
    """A scripted model's chat template and the tokens its scripts and turns are made of."""

    template: str
    cue: str  # the token its script follows
    pieces: tuple[str, ...]  # one token each, decoded as their text
    special: tuple[str, ...] = ()  # one token each, special
    end: str = EOS  # the token that ends its response


HERMES = Dialect(HERMES_TEMPLATE, GENERATION_PROMPT, (*PIECES, GENERATION_PROMPT))
QWEN = Dialect(QWEN_STYLE, "\n", (TOOL_CALL,), special=("<|im_start|>", END), end=END)


def scripted_model(directory: Path, script: Sequence[str] = (), dialect: Dialect = HERMES) -> Path:
    """A model directory at ``directory`` whose model writes ``script`` after the
    generation prompt of ``dialect``'s template (see the module's docstring)."""
    source = directory.with_name(directory.name + "-source")
    source.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer(_ALPHABET)
    tokenizer.add_special_tokens(list(dialect.special))
    tokenizer.add_tokens(list(dialect.pieces))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": _HIDDEN,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "eos_token_id": tokenizer.token_to_id(dialect.end),
        "pad_token_id": 0,
    }
    assert config["vocab_size"] <= _HIDDEN
    (source / "config.json").write_text(json.dumps(config))
    write_tokenizer_files(tokenizer, source)
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(
        json.dumps({**tokenizer_config, "eos_token": dialect.end})
    )
    (source / "chat_template.jinja").write_text(dialect.template)
    model = CausalLM(ModelConfig.from_hf(config))
    model.load_state_dict(script_state(model, tokenizer_ids(tokenizer), script, dialect))
    save_model(model, source, directory)
    return directory


def tool_caller_config(root: Path) -> dict:
    """A run's config (as a dict, under ``root``) serving the Qwen-style model that calls
    the add tool at every turn (:data:`TOOL_CALL`), at the temperature its margins are
    made for, with room for a long session's prompts."""
    directory = scripted_model(root / "model", [TOOL_CALL], QWEN)
    return {
        "run": {"dir": str(root / "run")},
        "data": {"harness": "tests.support.harnesses:ask_once"},
        "model": {"path": str(directory), "max_new_tokens": 8, "max_prompt_tokens": 2048},
        "algorithm": {"temperature": 1.0},
    }


def tokenizer_ids(tokenizer) -> dict[str, int]:
    return tokenizer.get_vocab(with_added_tokens=True)


def script_state(
    model: CausalLM, ids: dict[str, int], script: Sequence[str], dialect: Dialect = HERMES
) -> dict[str, torch.Tensor]:
    """``model``'s weights made to write ``script`` (pieces of ``dialect``, none twice)
    after its cue, then its end token; ``ids``: the tokenizer's vocabulary."""
    chain = [ids[dialect.cue], *(ids[piece] for piece in script)]
    if len(set(chain)) != len(chain):
        raise ValueError(f"script {script!r}: a piece comes twice")
    state = {name: torch.zeros_like(t) for name, t in model.state_dict().items()}
    for name, tensor in state.items():
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
    vocab = model.config.vocab_size
    state["model.embed_tokens.weight"][:, :vocab] = torch.eye(vocab)  # token t: axis t
    head = state["lm_head.weight"]
    end = ids[dialect.end]
    head[end, :vocab] = _MARGIN  # every token not in the chain is followed by the end
    for token, following in zip(chain, [*chain[1:], end], strict=True):
        head[end, token] = 0.0
        head[following, token] = _MARGIN
    return state
