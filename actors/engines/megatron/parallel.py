"""megatron-core ``GPTModel`` state dicts split over tensor-, expert- and pipeline-parallel
ranks, and merged back (names as in mapping.py). Pure tensor code: no megatron import."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .mapping import EMBEDDING, EXPERT, LAYER, OUTPUT, Layout, State

__all__ = [
    "merge_expert_parallel",
    "merge_pipeline_parallel",
    "merge_tensor_parallel",
    "split_expert_parallel",
    "split_pipeline_parallel",
    "split_tensor_parallel",
    "tensor_parallel_dim",
]


# --- tensor parallel -------------------------------------------------------------------

# How each megatron tensor splits over tensor-parallel ranks, by the end of its name:
# along rows (column-parallel outputs, vocabulary), along columns (row-parallel inputs),
# rows per half (the fused [gate; up]), or not at all (norms, the router, row-parallel
# biases, which are added once after the ranks' partial sums are reduced).
_ROWS = (
    "linear_qkv.weight",
    "linear_qkv.bias",
    EMBEDDING,
    OUTPUT,
)
_COLUMNS = ("linear_proj.weight", "linear_fc2.weight")
_HALVES = ("linear_fc1.weight", "linear_fc1.bias")


def _tp_dim(name: str) -> str:
    if name.endswith(_ROWS):
        return "rows"
    if name.endswith(_COLUMNS):
        return "columns"
    if name.endswith(_HALVES):
        return "halves"
    return "whole"


def tensor_parallel_dim(name: str) -> int | None:
    """The dimension a megatron tensor is split along over tensor-parallel ranks; None
    for one every rank holds whole."""
    return {"rows": 0, "halves": 0, "columns": 1}.get(_tp_dim(name))


def split_tensor_parallel(state: Mapping[str, torch.Tensor], ranks: int) -> list[State]:
    """Each tensor-parallel rank's part of a megatron state (whole or one stage's)."""
    out: list[State] = [{} for _ in range(ranks)]
    for name, tensor in state.items():
        how = _tp_dim(name)
        if how == "rows":
            parts = _even(tensor, ranks, 0, name)
        elif how == "columns":
            parts = _even(tensor, ranks, 1, name)
        elif how == "halves":
            gates, ups = (_even(h, ranks, 0, name) for h in tensor.chunk(2))
            parts = [torch.cat(pair) for pair in zip(gates, ups, strict=True)]
        else:
            parts = [tensor] * ranks
        for rank, part in enumerate(parts):
            out[rank][name] = part
    return out


def merge_tensor_parallel(shards: list[Mapping[str, torch.Tensor]]) -> State:
    """The state the tensor-parallel ``shards`` (in rank order) were split from."""
    out: State = {}
    for name in shards[0]:
        parts = [shard[name] for shard in shards]
        how = _tp_dim(name)
        if how == "rows":
            out[name] = torch.cat(parts)
        elif how == "columns":
            out[name] = torch.cat(parts, dim=1)
        elif how == "halves":
            halves = [p.chunk(2) for p in parts]
            out[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        else:
            out[name] = parts[0]
    return out


def _even(tensor: torch.Tensor, ranks: int, dim: int, name: str) -> list[torch.Tensor]:
    if tensor.shape[dim] % ranks:
        raise ValueError(f"{name}: {tensor.shape[dim]} does not split over {ranks} ranks")
    return list(tensor.chunk(ranks, dim=dim))


# --- expert parallel -------------------------------------------------------------------


def split_expert_parallel(state: Mapping[str, torch.Tensor], ranks: int) -> list[State]:
    """Each expert-parallel rank's part: a contiguous block of the experts, numbered from 0
    on every rank (megatron's local numbering); every other tensor on every rank."""
    out: list[State] = [{} for _ in range(ranks)]
    per_rank = None
    for name, tensor in state.items():
        layer, expert, rest = _expert_of(name)
        if expert is None:
            for part in out:
                part[name] = tensor
            continue
        if per_rank is None:
            per_rank = _experts_per_rank(state, ranks)
        rank, local = divmod(expert, per_rank)
        out[rank][f"decoder.layers.{layer}.mlp.experts.local_experts.{local}.{rest}"] = tensor
    return out


def merge_expert_parallel(shards: list[Mapping[str, torch.Tensor]]) -> State:
    """The state the expert-parallel ``shards`` (in rank order) were split from."""
    out: State = {}
    per_rank = max(
        (e + 1 for shard in shards[:1] for n in shard if (e := _expert_of(n)[1]) is not None),
        default=0,
    )
    for rank, shard in enumerate(shards):
        for name, tensor in shard.items():
            layer, expert, rest = _expert_of(name)
            if expert is None:
                out.setdefault(name, tensor)
            else:
                index = rank * per_rank + expert
                out[f"decoder.layers.{layer}.mlp.experts.local_experts.{index}.{rest}"] = tensor
    return out


def _expert_of(name: str) -> tuple[int | None, int | None, str]:
    layer = LAYER.match(name)
    if layer is None:
        return None, None, name
    expert = EXPERT.match(layer.group(2))
    if expert is None:
        return int(layer.group(1)), None, layer.group(2)
    return int(layer.group(1)), int(expert.group(1)), expert.group(2)


def _experts_per_rank(state: Mapping[str, torch.Tensor], ranks: int) -> int:
    count = 1 + max(e for n in state if (e := _expert_of(n)[1]) is not None)
    if count % ranks:
        raise ValueError(f"{count} experts do not split over {ranks} expert-parallel ranks")
    return count // ranks


# --- pipeline parallel -----------------------------------------------------------------


def split_pipeline_parallel(
    state: Mapping[str, torch.Tensor], layout: Layout, stages: int
) -> list[State]:
    """Each stage's part: its block of layers numbered from 0; the embedding on the first
    stage, the final norm and output layer on the last (a tied output layer is the
    embedding's copy there, as megatron keeps it)."""
    if layout.layers % stages:
        raise ValueError(f"{layout.layers} layers do not split into {stages} pipeline stages")
    per_stage = layout.layers // stages
    out: list[State] = [{} for _ in range(stages)]
    for name, tensor in state.items():
        match = LAYER.match(name)
        if match is not None:
            stage, local = divmod(int(match.group(1)), per_stage)
            out[stage][f"decoder.layers.{local}.{match.group(2)}"] = tensor
        elif name == EMBEDDING:
            out[0][name] = tensor
            if layout.tied and stages > 1:
                out[-1][OUTPUT] = tensor
        else:  # the final norm and the output layer
            out[-1][name] = tensor
    return out


def merge_pipeline_parallel(stages: list[Mapping[str, torch.Tensor]], layout: Layout) -> State:
    """The state the pipeline ``stages`` (in order) were split from."""
    per_stage = layout.layers // len(stages)
    out: State = {}
    for stage, part in enumerate(stages):
        for name, tensor in part.items():
            match = LAYER.match(name)
            if match is not None:
                index = stage * per_stage + int(match.group(1))
                out[f"decoder.layers.{index}.{match.group(2)}"] = tensor
            elif not (name == OUTPUT and layout.tied):  # the last stage's copy of the embedding
                out[name] = tensor
    return out
