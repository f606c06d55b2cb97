"""A decoder-only transformer of the Llama / Qwen2 family, with Hugging Face parameter names.

One implementation serves every role, so the generator's behaviour log-probs and the
trainer's recomputed ones come from the same arithmetic. Parameter names match
``transformers``' ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` exactly, so a checkpoint
loads in either direction without renaming.

Two ways in:

- :meth:`CausalLM.forward`: whole right-padded sequences, causal attention (train, logp);
- :meth:`CausalLM.step`: new tokens of many independent sequences against a
  :class:`KVCache`, each at its own position (the continuous-batching decoder).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SUPPORTED_ARCHITECTURES", "CausalLM", "KVCache", "ModelConfig"]

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture fields of a Hugging Face ``config.json`` that this model reads."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # biases on q, k, v (Qwen2 always; Llama when configured)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelConfig:
        archs = config.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            supported = ", ".join(SUPPORTED_ARCHITECTURES)
            raise ValueError(f"config.json architectures={archs}: supported are {supported}")
        heads = config["num_attention_heads"]
        return cls(
            architecture=arch,
            vocab_size=config["vocab_size"],
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(config),
            max_position_embeddings=config["max_position_embeddings"],
            tie_word_embeddings=config.get("tie_word_embeddings", False),
            attention_bias=arch == "Qwen2ForCausalLM" or config.get("attention_bias", False),
        )

    def to_hf(self) -> dict[str, Any]:
        model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}[self.architecture]
        return {
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": False,
        }


def _rope_theta(config: dict[str, Any]) -> float:
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", None):
        raise ValueError(f"config.json rope scaling {kind!r} is not supported (only default)")
    return float(config.get("rope_theta") or scaling.get("rope_theta") or 10000.0)


class KVCache:
    """Keys and values for ``slots`` sequences of up to ``max_len`` tokens each.

    Laid out [layer, slot, position, head, dim]: slot and position side by side make
    writing one token per sequence a single indexed copy.
    """

    def __init__(self, config: ModelConfig, slots: int, max_len: int, dtype: torch.dtype):
        shape = (config.num_hidden_layers, slots, max_len, config.num_key_value_heads)
        self.keys = torch.zeros(*shape, config.head_dim, dtype=dtype)
        self.values = torch.zeros(*shape, config.head_dim, dtype=dtype)
        self.max_len = max_len


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class _Rotary(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        half = torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim
        self.register_buffer("inv_freq", 1.0 / (config.rope_theta**half), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin shaped [batch, 1, tokens, head_dim] for ``positions`` [batch, tokens]."""
        angles = positions.float()[..., None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-second, first), dim=-1) * sin.to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        inner, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv, bias=bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=False)

    def _project(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rotate(q, *rope), _rotate(k, *rope), v

    def _out(self, attended: torch.Tensor) -> torch.Tensor:
        batch, _, tokens, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(batch, tokens, -1))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = self._project(x, rope)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self._out(attended)

    def step(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
    ) -> torch.Tensor:
        """Attend new tokens (at ``positions`` of ``slots``) to everything cached before them."""
        q, k, v = self._project(x, rope)
        keys, values = cache
        rows = slots[:, None].expand_as(positions)
        keys[rows, positions] = k.transpose(1, 2)
        values[rows, positions] = v.transpose(1, 2)
        span = visible.shape[-1]  # only the positions some row can see
        rows_of = _run(slots)  # a run of consecutive slots is read as a view, not a copy
        keys, values = keys[rows_of, :span], values[rows_of, :span]
        attended = F.scaled_dot_product_attention(
            q,
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=visible[:, None],
            enable_gqa=True,
        )
        return self._out(attended)


def _run(slots: torch.Tensor) -> slice | torch.Tensor:
    """``slots`` as a slice when they are consecutive and ascending, else as they are."""
    first, last = int(slots[0]), int(slots[-1])
    if last - first + 1 == len(slots) and bool((slots[1:] > slots[:-1]).all()):
        return slice(first, last + 1)
    return slots


class _MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)
        self.input_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = _RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, attend) -> torch.Tensor:
        x = x + attend(self.self_attn, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class _Backbone(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))
        self.norm = _RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """The model: token ids in, next-token logits out."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Backbone(config)
        self.rotary = _Rotary(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [batch, tokens, vocab] of right-padded sequences (padding never leaks back)."""
        batch, tokens = input_ids.shape
        positions = torch.arange(tokens).expand(batch, tokens)
        rope = self.rotary(positions)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, lambda attn, h: attn(h, rope))
        return self.lm_head(self.model.norm(x))

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        return KVCache(self.config, slots, max_len, self.lm_head.weight.dtype)

    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache: KVCache,
    ) -> torch.Tensor:
        """Logits [rows, tokens, vocab] for ``input_ids`` [rows, tokens] placed at ``positions``
        of cache ``slots`` [rows]; each token sees its slot's cache up to its own position."""
        rope = self.rotary(positions)
        # Attend over the longest prefix any row needs, not the whole cache.
        span = torch.arange(int(positions.max()) + 1)
        visible = span[None, None, :] <= positions[:, :, None]  # [rows, tokens, span]
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            kv = (cache.keys[i], cache.values[i])
            x = layer(x, lambda attn, h, kv=kv: attn.step(h, rope, kv, slots, positions, visible))
        return self.lm_head(self.model.norm(x))
