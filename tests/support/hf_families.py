"""Tiny random models of each supported family, made by transformers itself (no download).

Each is saved with ``save_pretrained`` beside a char tokenizer (the arithmetic task's), so
it is a model directory as one would find on the hub, only small.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from asyncrl.actors.policy.tokenizer import build_char_tokenizer, write_tokenizer_files
from tests.tools.warmup import ALPHABET

SMALL = {
    "vocab_size": 40,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "bos_token_id": None,
}

# name → (model_type, config fields beyond SMALL). Together they cover every switch.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama3-rope-untied-biases": (
        "llama",
        {
            "tie_word_embeddings": False,
            "attention_bias": True,
            "mlp_bias": True,
            # head_dim 8, theta 1e4: wavelengths 6, 63, 628, 6283 against 64 / 4 = 16 and
            # 64 / 1 = 64: one kept, one blended, two slowed.
            "rope_theta": 10000.0,
            "max_position_embeddings": 128,  # beyond the original context, as in Llama 3.1
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "llama-linear-rope": (
        "llama",
        {"tie_word_embeddings": False, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    ),
    "mistral-sliding": ("mistral", {"tie_word_embeddings": False, "sliding_window": 4}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
    "qwen2-sliding-upper-layer": (
        "qwen2",
        {
            "tie_word_embeddings": False,
            "use_sliding_window": True,
            "sliding_window": 3,
            "max_window_layers": 1,
        },
    ),
    # head_dim 12 differs from hidden_size / heads = 8, as Qwen3's often does.
    "qwen3": ("qwen3", {"tie_word_embeddings": True, "head_dim": 12}),
    "qwen3-untied-bias": (
        "qwen3",
        {"tie_word_embeddings": False, "head_dim": 12, "attention_bias": True},
    ),
    # 4 experts, 2 per token: with 12 tokens of 3 sequences every expert gets some.
    "qwen3-moe": (
        "qwen3_moe",
        {
            "tie_word_embeddings": False,
            "head_dim": 12,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "norm_topk_prob": True,
        },
    ),
    "qwen3-moe-unnormalised-tied": (
        "qwen3_moe",
        {
            "tie_word_embeddings": True,
            "head_dim": 12,
            "num_experts": 3,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 8,
            "norm_topk_prob": False,
        },
    ),
}


def hf_model(model_type: str, seed: int = 0, **fields: Any) -> Any:
    """A transformers model of ``model_type`` with every parameter random (biases and
    norm weights too, so that none of them can be skipped unnoticed)."""
    import transformers

    config = transformers.AutoConfig.for_model(model_type, **(SMALL | fields))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            centre = 1.0 if "norm" in name else 0.0
            param.copy_(centre + 0.2 * torch.randn_like(param))
    return model


def save_hf_model(model: Any, directory: Path, max_shard_size: str | None = None) -> Path:
    """``model`` saved by transformers into ``directory``, with a char tokenizer."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    write_tokenizer_files(build_char_tokenizer(ALPHABET), directory)
    return directory


def hf_model_dir(directory: Path, variant: str, max_shard_size: str | None = None) -> Path:
    """A directory holding ``variant`` of :data:`VARIANTS`."""
    model_type, fields = VARIANTS[variant]
    return save_hf_model(hf_model(model_type, **fields), directory, max_shard_size)


# model_type -> (its class, fields beyond those of every tiny task model)
TASK_MODEL_KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("Qwen3ForCausalLM", {}),
    "qwen3_moe": (
        "Qwen3MoeForCausalLM",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24},
    ),
}


def tiny_task_model(directory: Path, model_type: str = "qwen3", **fields: Any) -> Path:
    """A tiny random Qwen3 (or Qwen3-MoE) directory whose vocabulary holds the arithmetic
    task's char tokenizer (17 tokens), for whole runs; ``fields`` change its config."""
    model = hf_model(
        model_type,
        **(
            {
                "vocab_size": 32,
                "hidden_size": 32,
                "head_dim": 16,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "max_position_embeddings": 128,
                "tie_word_embeddings": True,
                "eos_token_id": 1,
                "pad_token_id": 0,
            }
            | TASK_MODEL_KINDS[model_type][1]
            | fields
        ),
    )
    return save_hf_model(model, directory)
