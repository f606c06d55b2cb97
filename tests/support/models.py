"""A tiny random model directory in Hugging Face format, for tests that need a real model."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from asyncrl.actors.policy.checkpoint import save_model
from asyncrl.actors.policy.model import CausalLM, ModelConfig
from asyncrl.actors.policy.tokenizer import build_char_tokenizer, write_tokenizer_files
from tests.tools.warmup import ALPHABET

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "eos_token_id": 1,
    "pad_token_id": 0,
}


def tiny_model(directory: Path, seed: int = 0) -> Path:
    """Write a random TINY model (char tokenizer of the arithmetic task) to ``directory``."""
    torch.manual_seed(seed)
    source = directory.with_name(directory.name + "-source")
    source.mkdir(parents=True, exist_ok=True)
    (source / "config.json").write_text(json.dumps(TINY))
    write_tokenizer_files(build_char_tokenizer(ALPHABET), source)
    save_model(CausalLM(ModelConfig.from_hf(TINY)), source, directory)
    return directory
