"""Hugging Face state dicts <-> megatron-core ``GPTModel`` state dicts (their split over
tensor-, expert- and pipeline-parallel ranks: parallel.py). Pure tensor code: no megatron
import.

The two layouts differ in three ways besides names:

- megatron fuses q/k/v into one ``linear_qkv`` laid out per query group: for each
  key/value head g, the query heads that share it, then key head g, then value head g.
  A tensor-parallel split of that tensor along its rows then hands each rank whole groups;
- it fuses the MLP's gate and up projections into ``linear_fc1`` = [gate; up], and a
  rank's shard is [its gate rows; its up rows] (so a split is per half, not of the whole);
- its vocabulary may be padded so that the embedding and output layer split evenly;
  padding rows are zeros here and dropped on the way back.

Families: Llama, Mistral, Qwen2 (q/k/v biases), Qwen3 (per-head q/k RMSNorm) and
Qwen3-MoE (a router and per-expert MLPs), tied or untied output layer. Names are those of
megatron's local layer spec; :func:`to_te_names` gives the Transformer Engine spec's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

__all__ = [
    "Layout",
    "from_te_names",
    "hf_to_megatron",
    "megatron_to_hf",
    "slice_to_hf",
    "to_te_names",
]

State = dict[str, torch.Tensor]

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(.+)$")
_MOE_ARCHITECTURES = ("Qwen3MoeForCausalLM",)


@dataclass(frozen=True)
class Layout:
    """The shapes and switches both layouts need to convert one model."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # the dense MLP's inner size
    vocab: int
    tied: bool
    qkv_bias: bool = False
    proj_bias: bool = False  # o_proj / linear_proj
    mlp_bias: bool = False
    qk_norm: bool = False
    experts: int = 0  # 0: a dense MLP in every layer
    expert_ffn: int = 0
    padded_vocab: int = 0  # megatron's vocabulary rows; 0: the same as vocab

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads do not share {self.kv_heads} kv heads")
        if self.padded_vocab and self.padded_vocab < self.vocab:
            raise ValueError(f"padded_vocab={self.padded_vocab} < vocab={self.vocab}")

    @property
    def rows(self) -> int:
        """Vocabulary rows on the megatron side."""
        return self.padded_vocab or self.vocab

    def padded_for(self, tensor_parallel: int) -> Layout:
        """This layout with the vocabulary padded to split over ``tensor_parallel`` ranks."""
        rows = -(-self.vocab // tensor_parallel) * tensor_parallel
        return replace(self, padded_vocab=rows)

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> Layout:
        """From a ``config.json`` of a supported family (Qwen3-MoE included)."""
        arch = (config.get("architectures") or [""])[0]
        heads = config["num_attention_heads"]
        bias = bool(config.get("attention_bias", False))
        qwen2 = arch == "Qwen2ForCausalLM"
        # transformers 5 writes num_local_experts where 4.x wrote num_experts.
        count = config.get("num_experts") or config.get("num_local_experts") or 0
        experts = count if arch in _MOE_ARCHITECTURES else 0
        if experts and (config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1):
            raise ValueError("Qwen3-MoE with dense layers between sparse ones is not supported")
        return cls(
            layers=config["num_hidden_layers"],
            hidden=config["hidden_size"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            ffn=config["intermediate_size"],
            vocab=config["vocab_size"],
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=qwen2 or bias,
            proj_bias=bias and not qwen2,
            mlp_bias=arch == "LlamaForCausalLM" and bool(config.get("mlp_bias", False)),
            qk_norm=arch.startswith("Qwen3"),
            experts=experts,
            expert_ffn=config.get("moe_intermediate_size", 0) if experts else 0,
        )


# --- Hugging Face -> megatron ------------------------------------------------------------


def hf_to_megatron(hf: Mapping[str, torch.Tensor], layout: Layout) -> State:
    """The whole (unsplit) megatron state of a Hugging Face one; KeyError names a missing
    tensor, ValueError an unexpected one."""
    source = dict(hf)
    out: State = {EMBEDDING: _pad_rows(source.pop("model.embed_tokens.weight"), layout)}
    for i in range(layout.layers):
        out.update(_layer_to_megatron(source, f"model.layers.{i}.", f"decoder.layers.{i}.", layout))
    out[FINAL_NORM] = source.pop("model.norm.weight")
    head = source.pop("lm_head.weight", None)  # a tied model may store it, or not
    if not layout.tied:
        if head is None:
            raise KeyError("lm_head.weight")
        out[OUTPUT] = _pad_rows(head, layout)
    if source:
        raise ValueError(f"tensors this layout has no place for: {sorted(source)[:5]}")
    return out


def _layer_to_megatron(src: State, hf: str, mg: str, layout: Layout) -> State:
    attn = f"{hf}self_attn."
    out = {
        f"{mg}input_layernorm.weight": src.pop(f"{hf}input_layernorm.weight"),
        f"{mg}self_attention.linear_qkv.weight": _fuse_qkv(
            src.pop(f"{attn}q_proj.weight"),
            src.pop(f"{attn}k_proj.weight"),
            src.pop(f"{attn}v_proj.weight"),
            layout,
        ),
        f"{mg}self_attention.linear_proj.weight": src.pop(f"{attn}o_proj.weight"),
        f"{mg}pre_mlp_layernorm.weight": src.pop(f"{hf}post_attention_layernorm.weight"),
    }
    if layout.qkv_bias:
        out[f"{mg}self_attention.linear_qkv.bias"] = _fuse_qkv(
            src.pop(f"{attn}q_proj.bias"),
            src.pop(f"{attn}k_proj.bias"),
            src.pop(f"{attn}v_proj.bias"),
            layout,
        )
    if layout.proj_bias:
        out[f"{mg}self_attention.linear_proj.bias"] = src.pop(f"{attn}o_proj.bias")
    if layout.qk_norm:
        out[f"{mg}self_attention.q_layernorm.weight"] = src.pop(f"{attn}q_norm.weight")
        out[f"{mg}self_attention.k_layernorm.weight"] = src.pop(f"{attn}k_norm.weight")
    if layout.experts:
        out[f"{mg}mlp.router.weight"] = src.pop(f"{hf}mlp.gate.weight")
        for e in range(layout.experts):
            out.update(
                _mlp_to_megatron(
                    src, f"{hf}mlp.experts.{e}.", f"{mg}mlp.experts.local_experts.{e}.", False
                )
            )
    else:
        out.update(_mlp_to_megatron(src, f"{hf}mlp.", f"{mg}mlp.", layout.mlp_bias))
    return out


def _mlp_to_megatron(src: State, hf: str, mg: str, bias: bool) -> State:
    out = {
        f"{mg}linear_fc1.weight": torch.cat(
            (src.pop(f"{hf}gate_proj.weight"), src.pop(f"{hf}up_proj.weight"))
        ),
        f"{mg}linear_fc2.weight": src.pop(f"{hf}down_proj.weight"),
    }
    if bias:
        out[f"{mg}linear_fc1.bias"] = torch.cat(
            (src.pop(f"{hf}gate_proj.bias"), src.pop(f"{hf}up_proj.bias"))
        )
        out[f"{mg}linear_fc2.bias"] = src.pop(f"{hf}down_proj.bias")
    return out


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout) -> torch.Tensor:
    """[q heads of group 0, k 0, v 0, q heads of group 1, k 1, v 1, ...] by rows."""
    groups, d = layout.kv_heads, layout.head_dim
    per_group = layout.heads // groups
    rest = q.shape[1:]  # (hidden,) for weights, () for biases
    fused = torch.cat(
        (
            q.reshape(groups, per_group * d, *rest),
            k.reshape(groups, d, *rest),
            v.reshape(groups, d, *rest),
        ),
        dim=1,
    )
    return fused.reshape(-1, *rest)


def _pad_rows(weight: torch.Tensor, layout: Layout) -> torch.Tensor:
    if weight.shape[0] != layout.vocab:
        raise ValueError(f"a vocabulary of {weight.shape[0]} rows; the layout has {layout.vocab}")
    extra = layout.rows - layout.vocab
    if not extra:
        return weight
    return torch.cat((weight, weight.new_zeros(extra, *weight.shape[1:])))


# --- megatron -> Hugging Face ------------------------------------------------------------


def megatron_to_hf(mg: Mapping[str, torch.Tensor], layout: Layout) -> State:
    """The Hugging Face state of a whole megatron one; a tied output layer is stored once
    (as a Hugging Face checkpoint stores it: no ``lm_head.weight``)."""
    source = {k: t for k, t in mg.items() if not k.endswith("_extra_state")}
    out: State = {"model.embed_tokens.weight": source.pop(EMBEDDING)[: layout.vocab]}
    for i in range(layout.layers):
        out.update(_layer_to_hf(source, f"decoder.layers.{i}.", f"model.layers.{i}.", layout))
    out["model.norm.weight"] = source.pop(FINAL_NORM)
    head = source.pop(OUTPUT, None)  # with tied embeddings megatron may keep no copy
    if not layout.tied:
        if head is None:
            raise KeyError(OUTPUT)
        out["lm_head.weight"] = head[: layout.vocab]
    if source:
        raise ValueError(f"megatron tensors this layout has no place for: {sorted(source)[:5]}")
    return out


def _layer_to_hf(src: State, mg: str, hf: str, layout: Layout) -> State:
    attn, sa = f"{hf}self_attn.", f"{mg}self_attention."
    q, k, v = _split_qkv(src.pop(f"{sa}linear_qkv.weight"), layout)
    out = {
        f"{hf}input_layernorm.weight": src.pop(f"{mg}input_layernorm.weight"),
        f"{attn}q_proj.weight": q,
        f"{attn}k_proj.weight": k,
        f"{attn}v_proj.weight": v,
        f"{attn}o_proj.weight": src.pop(f"{sa}linear_proj.weight"),
        f"{hf}post_attention_layernorm.weight": src.pop(f"{mg}pre_mlp_layernorm.weight"),
    }
    if layout.qkv_bias:
        q, k, v = _split_qkv(src.pop(f"{sa}linear_qkv.bias"), layout)
        out |= {f"{attn}q_proj.bias": q, f"{attn}k_proj.bias": k, f"{attn}v_proj.bias": v}
    if layout.proj_bias:
        out[f"{attn}o_proj.bias"] = src.pop(f"{sa}linear_proj.bias")
    if layout.qk_norm:
        out[f"{attn}q_norm.weight"] = src.pop(f"{sa}q_layernorm.weight")
        out[f"{attn}k_norm.weight"] = src.pop(f"{sa}k_layernorm.weight")
    if layout.experts:
        out[f"{hf}mlp.gate.weight"] = src.pop(f"{mg}mlp.router.weight")
        for e in range(layout.experts):
            out.update(
                _mlp_to_hf(
                    src, f"{mg}mlp.experts.local_experts.{e}.", f"{hf}mlp.experts.{e}.", False
                )
            )
    else:
        out.update(_mlp_to_hf(src, f"{mg}mlp.", f"{hf}mlp.", layout.mlp_bias))
    return out


def _mlp_to_hf(src: State, mg: str, hf: str, bias: bool) -> State:
    gate, up = src.pop(f"{mg}linear_fc1.weight").chunk(2)
    out = {
        f"{hf}gate_proj.weight": gate,
        f"{hf}up_proj.weight": up,
        f"{hf}down_proj.weight": src.pop(f"{mg}linear_fc2.weight"),
    }
    if bias:
        gate, up = src.pop(f"{mg}linear_fc1.bias").chunk(2)
        out |= {f"{hf}gate_proj.bias": gate, f"{hf}up_proj.bias": up}
        out[f"{hf}down_proj.bias"] = src.pop(f"{mg}linear_fc2.bias")
    return out


def _split_qkv(fused: torch.Tensor, layout: Layout):
    groups, d = layout.kv_heads, layout.head_dim
    per_group = layout.heads // groups
    rest = fused.shape[1:]
    q, k, v = fused.reshape(groups, (per_group + 2) * d, *rest).split((per_group * d, d, d), dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def slice_to_hf(
    mg: Mapping[str, torch.Tensor],
    layout: Layout,
    rank: int,
    ranks: int,
    first_layer: int,
    expert_rank: int = 0,
    expert_ranks: int = 1,
) -> tuple[State, dict[str, int]]:
    """What one rank of a split megatron model holds, as its own slice of the Hugging Face
    state, and the dimension each tensor of it is split along (where not 0).

    ``mg``: the rank's local state (tensor-parallel rank ``rank`` of ``ranks``, one pipeline
    stage's layers numbered from 0, ``first_layer`` the stage's first; expert-parallel rank
    ``expert_rank`` of ``expert_ranks``, its block of the experts numbered from 0).

    A column-parallel layer's rank holds whole query groups and a share of the MLP, so its
    q, k, v, gate and up projections are row ranges of the whole, in rank order; a
    row-parallel layer's (o_proj, down_proj) are column ranges; the vocabulary's rows are
    ranges with megatron's padding dropped. A tensor every rank holds whole (a
    norm, a row-parallel bias, the router) is in rank 0's slice only; a tied output layer
    is not published (the embedding is). An expert-parallel rank's experts are its own;
    every other tensor is in expert-parallel rank 0's slice only.
    """
    local = replace(
        layout,
        heads=layout.heads // ranks,
        kv_heads=layout.kv_heads // ranks,
        ffn=layout.ffn // ranks,
        expert_ffn=layout.expert_ffn // ranks,
        experts=layout.experts // expert_ranks,
    )
    source = {k: t for k, t in mg.items() if not k.endswith("_extra_state")}
    out: State = {}
    rows = layout.rows // ranks  # of the padded vocabulary, per rank
    real = max(0, min(rows, layout.vocab - rank * rows))  # past them: padding
    if EMBEDDING in source:
        out["model.embed_tokens.weight"] = source.pop(EMBEDDING)[:real]
    head = source.pop(OUTPUT, None)
    if head is not None and not layout.tied:
        out["lm_head.weight"] = head[:real]
    if FINAL_NORM in source:
        out["model.norm.weight"] = source.pop(FINAL_NORM)
    layers = sorted({int(m.group(1)) for n in source if (m := LAYER.match(n))})
    first_expert = expert_rank * local.experts
    for i in layers:
        hf = f"model.layers.{first_layer + i}."
        for name, tensor in _layer_to_hf(source, f"decoder.layers.{i}.", hf, local).items():
            expert = _HF_EXPERT.match(name)
            if expert is not None:  # numbered in the whole model
                name = f"{expert.group(1)}{first_expert + int(expert.group(2))}{expert.group(3)}"
            out[name] = tensor
    if source:
        raise ValueError(f"megatron tensors this layout has no place for: {sorted(source)[:5]}")
    if expert_rank != 0:  # the rest is the same on every expert rank: the first's slice
        out = {name: t for name, t in out.items() if _HF_EXPERT.match(name)}
    if ranks == 1:
        return out, {}
    dims = {}
    for name in list(out):
        if name.endswith(_HF_COLUMNS):
            dims[name] = 1
        elif not name.endswith(_HF_ROWS) and rank != 0:
            del out[name]  # whole on every rank: rank 0's slice holds it
    return out, dims


# Split over tensor-parallel ranks, by the end of a Hugging Face name: along rows
# (column-parallel layers, the vocabulary) or along columns (row-parallel layers' weights).
_HF_ROWS = (
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "q_proj.bias",
    "k_proj.bias",
    "v_proj.bias",
    "gate_proj.weight",
    "up_proj.weight",
    "gate_proj.bias",
    "up_proj.bias",
    "embed_tokens.weight",
    "lm_head.weight",
)
_HF_COLUMNS = ("o_proj.weight", "down_proj.weight")
_HF_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts\.)(\d+)(\..+)$")


# --- Transformer Engine names ----------------------------------------------------------

# The TE spec fuses the norm before a linear layer into that layer (its layer_norm_weight)
# and keeps a grouped MLP's experts as one module with numbered weights.
_TE_RENAMES = (
    (re.compile(r"\.input_layernorm\.weight$"), ".self_attention.linear_qkv.layer_norm_weight"),
    (
        re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.(linear_fc[12])\.(weight|bias)$"),
        r".mlp.experts.\2.\3\1",
    ),
)
_TE_DENSE_NORM = (re.compile(r"\.pre_mlp_layernorm\.weight$"), ".mlp.linear_fc1.layer_norm_weight")


def to_te_names(state: Mapping[str, torch.Tensor], layout: Layout) -> State:
    """Local-spec names as the Transformer Engine spec names the same tensors."""
    renames = _TE_RENAMES if layout.experts else (*_TE_RENAMES, _TE_DENSE_NORM)
    out: State = {}
    for name, tensor in state.items():
        for pattern, replacement in renames:
            name = pattern.sub(replacement, name)
        out[name] = tensor
    return out


def from_te_names(state: Mapping[str, torch.Tensor], layout: Layout) -> State:
    """The inverse of :func:`to_te_names` (TE's ``_extra_state`` entries dropped)."""
    out: State = {}
    for name, tensor in state.items():
        if name.endswith("_extra_state"):
            continue
        name = re.sub(
            r"\.self_attention\.linear_qkv\.layer_norm_weight$", ".input_layernorm.weight", name
        )
        if not layout.experts:
            name = re.sub(
                r"\.mlp\.linear_fc1\.layer_norm_weight$", ".pre_mlp_layernorm.weight", name
            )
        name = re.sub(
            r"\.mlp\.experts\.(linear_fc[12])\.(weight|bias)(\d+)$",
            r".mlp.experts.local_experts.\3.\1.\2",
            name,
        )
        out[name] = tensor
    return out
