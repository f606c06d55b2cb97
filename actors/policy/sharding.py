"""Splitting a model's parameters over the ranks of a group (FSDP2, ``fully_shard``).

Each decoder layer is one unit, gathered whole only while it computes; an untied
embedding and output layer are units of their own for the same reason (left to the root
unit, both would stay whole from the start of forward to the end of backward, gradients
too). Tied, they share one tensor and so stay in the root unit.

torch's FSDP, DTensor and distributed checkpoint packages are imported where a group
uses them, not with this module: a process of one rank (most workers) never needs them,
and they cost about a second of CPU each time one starts (sympy and torch._dynamo come
with them). :func:`is_dtensor` asks without importing them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist

from .model import Decoder

__all__ = ["full_tensor", "is_dtensor", "load_into_shards", "local_part", "shard", "state_dicts"]


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a shard of a group's tensor (FSDP2's ``DTensor``). Without the
    package imported no tensor can be one, so it is not imported to ask."""
    package = sys.modules.get("torch.distributed.tensor")
    return package is not None and isinstance(value, package.DTensor)


def state_dicts() -> ModuleType:
    """torch's distributed checkpoint state-dict helpers (whole states in and out of a
    group's shards), imported at their first use."""
    from torch.distributed.checkpoint import state_dict

    return state_dict


def local_part(value: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``value``: a DTensor's local shard, or ``value`` itself."""
    return value.to_local() if is_dtensor(value) else value


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """``value`` whole on every rank (a collective for a DTensor), or ``value`` itself."""
    return value.full_tensor() if is_dtensor(value) else value


def shard(model: Decoder, device: torch.device, ranks: int) -> None:
    """Shard ``model`` (a language model, or the critic's) in place over the ``ranks`` of
    the default process group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (ranks,))
    units = list(model.model.layers)
    if not model.config.tie_word_embeddings:
        # the critic has no output layer: its value head is one row, left to the root
        head = getattr(model, "lm_head", None)
        units += [model.model.embed_tokens, *([] if head is None else [head])]
    for unit in units:
        fully_shard(unit, mesh=mesh)
    # The root too gives back its gathered weights after forward: a scorer runs no
    # backward that would, and new weights load into shards, not gathered copies.
    fully_shard(model, mesh=mesh, reshard_after_forward=True)
    if device.type == "cpu":
        for unit in [*units, model]:
            _reduce_by_all_reduce(unit)


class _AllReduceScatter:
    """FSDP's gradient reduce-scatter as an all-reduce of its input in place, each rank
    then copying out its own shard.

    gloo's reduce-scatter allocates 1.5 times its input on top of it (75 MiB for a unit's
    49 MiB of gradients, against 27 MiB for the all-reduce; 2 ranks on one host), and a
    unit's gradients are the peak of a CPU rank's step. The all-reduce was faster there
    too: 49 ms against 95 ms for those 49 MiB (medians of 10).
    """

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        dist.all_reduce(input_tensor, op=op, group=group)
        rows = input_tensor.view(dist.get_world_size(group), -1)
        output_tensor.copy_(rows[dist.get_rank(group)].view_as(output_tensor))


def _reduce_by_all_reduce(unit: torch.nn.Module) -> None:
    # set_custom_reduce_scatter is newer than the oldest torch this project supports.
    if hasattr(unit, "set_custom_reduce_scatter"):
        unit.set_custom_reduce_scatter(_AllReduceScatter())


def load_into_shards(model: Decoder, whole: Mapping[str, torch.Tensor] | None) -> None:
    """New weights into a sharded ``model``: rank 0 passes them whole (as the weight plane
    delivers them), the others None; each rank keeps its shard. A collective."""
    dcp = state_dicts()
    state: dict[str, torch.Tensor] = {}
    if whole is not None:
        state = dict(whole)
        if model.config.tie_word_embeddings:  # stored once; the model names it twice
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
    options = dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    dcp.set_model_state_dict(model, state, options=options)
