"""Splitting a model's parameters over the ranks of a group (FSDP2, ``fully_shard``).

Each decoder layer is one unit, gathered whole only while it computes; an untied
embedding and output layer are units of their own for the same reason (left to the root
unit, both would stay whole from the start of forward to the end of backward, gradients
too). Tied, they share one tensor and so stay in the root unit.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from .model import CausalLM

__all__ = ["load_into_shards", "shard"]


def shard(model: CausalLM, device: torch.device, ranks: int) -> None:
    """Shard ``model`` in place over the ``ranks`` of the default process group."""
    mesh = init_device_mesh(device.type, (ranks,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    if not model.config.tie_word_embeddings:
        fully_shard(model.model.embed_tokens, mesh=mesh)
        fully_shard(model.lm_head, mesh=mesh)
    # The root too gives back its gathered weights after forward: a scorer runs no
    # backward that would, and new weights load into shards, not gathered copies.
    fully_shard(model, mesh=mesh, reshard_after_forward=True)


def load_into_shards(model: CausalLM, whole: Mapping[str, torch.Tensor] | None) -> None:
    """New weights into a sharded ``model``: rank 0 passes them whole (as the weight plane
    delivers them), the others None; each rank keeps its shard. A collective."""
    state: dict[str, torch.Tensor] = {}
    if whole is not None:
        state = dict(whole)
        if model.config.tie_word_embeddings:  # stored once; the model names it twice
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state, options=options)
