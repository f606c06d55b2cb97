"""A tiny model directory that calls a tool at every turn, whatever it is sampled at.

Its weights are set by hand to a bigram model: each next token is the one the last token
names, with a logit so far above the others that sampling at temperature 1 always picks
it (its layers add nothing to the residual stream, the embedding is the identity, the
head maps a token to its successor). The chat template is ChatML with tools; the
tokenizer is one token per character, plus the tool call the model writes as a single
token. After a generation prompt (which ends with a newline) the model writes that tool
call, then ends its turn with ``<|im_end|>``: a real decoder and a real server give a
harness the same tool call at every turn.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

from asyncrl.actors.policy.checkpoint import save_model
from asyncrl.actors.policy.model import CausalLM, ModelConfig
from asyncrl.actors.policy.tokenizer import build_char_tokenizer, write_tokenizer_files
from tests.support.chat_templates import QWEN_STYLE

# The model's own spelling of its call, compact: the template writes it with spaces.
TOOL_CALL = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'
TOOL_CALL_ARGUMENTS = {"a": 1, "b": 2}
END = "<|im_end|>"
ALPHABET = string.ascii_letters + string.digits + " \n.,:;?!*+-=<>{}[]()/\"'_#|"
_WIDTH = 128  # the hidden size and the vocabulary: a token's embedding is its own axis


def tool_model(directory: Path) -> Path:
    """Write the model to ``directory``; returns it."""
    source = directory.with_name(directory.name + "-source")
    source.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer(ALPHABET)
    tokenizer.add_special_tokens(["<|im_start|>", END])
    tokenizer.add_tokens([TOOL_CALL])  # decoded as its text, unlike a special token
    write_tokenizer_files(tokenizer, source)
    (source / "chat_template.jinja").write_text(QWEN_STYLE)
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(
        json.dumps({**tokenizer_config, "eos_token": END})
    )
    ids = tokenizer.get_vocab()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": _WIDTH,
        "hidden_size": _WIDTH,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "eos_token_id": ids[END],
        "pad_token_id": ids["<pad>"],
    }
    assert tokenizer.get_vocab_size() <= _WIDTH, tokenizer.get_vocab_size()
    (source / "config.json").write_text(json.dumps(config))
    model = CausalLM(ModelConfig.from_hf(config))
    state = model.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                tensor.zero_()  # the layers add nothing: the last token alone decides
        state["model.embed_tokens.weight"].copy_(torch.eye(_WIDTH))
        head = state["lm_head.weight"]
        head.zero_()
        head[ids[TOOL_CALL], ids["\n"]] = 30.0  # after "assistant\n": the call
        head[ids[END], ids[TOOL_CALL]] = 30.0  # after the call: the end of the turn
    model.load_state_dict(state)
    save_model(model, source, directory)
    return directory
