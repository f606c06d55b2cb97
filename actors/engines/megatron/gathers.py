"""Collectives that put a split state together: every tensor-parallel rank's part, and
every pipeline stage's tensors, on every rank of the group."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from ...policy.collectives import all_gather_data, layout_of, read_layout
from .stage_links import Stages

__all__ = ["every_stage", "every_tensor_parallel_rank"]


def every_tensor_parallel_rank(
    state: Mapping[str, torch.Tensor], ranks: int
) -> list[dict[str, torch.Tensor]]:
    """Every tensor-parallel rank's ``state``, in rank order (a collective over them)."""
    group = parallel_state.get_tensor_model_parallel_group()
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(ranks)]
    for name, tensor in state.items():
        parts = [torch.empty_like(tensor) for _ in range(ranks)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        for rank, part in enumerate(parts):
            shards[rank][name] = part
    return shards


def every_stage(
    state: Mapping[str, torch.Tensor], stages: Stages, device: torch.device
) -> list[dict[str, torch.Tensor]]:
    """Every stage's ``state``, in stage order, on every stage (a collective over the
    pipeline group). The stages hold different tensors, so their names, shapes and
    dtypes go first, then each tensor from the stage that has it."""
    every = all_gather_data(layout_of(state), stages.group, device)
    out: list[dict[str, torch.Tensor]] = []
    for stage, names in enumerate(read_layout(described) for described in every):
        part = {}
        for name in sorted(names):
            shape, dtype = names[name]
            if stage == stages.stage:
                tensor = state[name].contiguous()
            else:
                tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(tensor, src=stages.global_rank(stage), group=stages.group)
            part[name] = tensor
        out.append(part)
    return out
