"""Splitting a model's parameters over the ranks of a group (FSDP2, ``fully_shard``).

Each decoder layer is one unit, gathered whole only while it computes; an untied
embedding and output layer are units of their own for the same reason (left to the root
unit, both would stay whole from the start of forward to the end of backward, gradients
too). Tied, they share one tensor and so stay in the root unit.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from .model import CausalLM

__all__ = ["shard"]


def shard(model: CausalLM, device: torch.device, ranks: int) -> None:
    """Shard ``model`` in place over the ``ranks`` of the default process group."""
    mesh = init_device_mesh(device.type, (ranks,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    if not model.config.tie_word_embeddings:
        fully_shard(model.model.embed_tokens, mesh=mesh)
        fully_shard(model.lm_head, mesh=mesh)
    fully_shard(model, mesh=mesh)
