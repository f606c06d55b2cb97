"""A CUDA trainer's weights copied into page-locked CPU memory, two sets used in turn.

The weight plane stages a version from CPU memory. Into page-locked memory the copies are
DMA transfers queued back to back with one wait at the end; into pageable memory each is
a synchronous copy through a bounce buffer, and fresh pages fault in as they are first
written. For a 0.5B model's 942 MiB on an H100: 1.8 s into pageable memory, 0.9 s into
page-locked memory allocated per version, 26 ms into these sets.

Two sets, allocated once: version N is copied into one while version N-1, which the
worker may still be publishing or saving, stays whole in the other. A set is written
again only two versions later, when the worker has replaced that version by a newer one
(it holds the newest version's weights alone).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["HostCopies"]


class HostCopies:
    def __init__(self) -> None:
        self._sets: list[dict[str, torch.Tensor]] = [{}, {}]
        self._next = 0

    def copy(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``state`` (on a CUDA device) in CPU memory; valid until the second next call."""
        host = self._sets[self._next]
        self._next = 1 - self._next
        for name, tensor in state.items():
            held = host.get(name)
            if held is None or held.shape != tensor.shape or held.dtype != tensor.dtype:
                held = host[name] = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            held.copy_(tensor, non_blocking=True)
        for name in host.keys() - state.keys():
            del host[name]
        torch.cuda.current_stream().synchronize()
        return dict(host)
