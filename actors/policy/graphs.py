"""Decode steps replayed from CUDA graphs: the torch engine's generation on a GPU.

A decode step of a 0.5B model launches hundreds of small kernels (24 layers of
projections, norms, rotary, cache writes and attention) whose GPU work is a few
milliseconds, while launching them one by one from Python takes ten times that: the step
is bound by the CPU. A CUDA graph records the launches of one step once and replays them
with one call.

A graph fixes every shape and address. So a step here always has the same number of rows
(the sequences decoding one new token each, padded to the next of a few batch sizes, one
graph per size, made the first time that size is needed), attends over the whole cache
(masked beyond each row's position), and reads its inputs from buffers that each replay
refills. Padding rows write to a spare cache slot that no sequence owns, at its last
position. Weights must stay where they are: on a GPU the decoder loads a new version by
copying into the same tensors, which the graphs then read.

Not graphed: steps that feed several tokens per sequence (a new prompt, a recomputed
cache after a new version), which run as before, and mixture-of-experts models, whose
routing decides on the host which experts compute.
"""

from __future__ import annotations

import torch

from .model import CausalLM, KVCache

__all__ = ["GraphedSteps", "batch_sizes"]


def batch_sizes(slots: int) -> list[int]:
    """The padded batch sizes for up to ``slots`` rows: powers of two, then ``slots``."""
    sizes = [1]
    while sizes[-1] < slots:
        sizes.append(min(sizes[-1] * 2, slots))
    return sizes


class GraphedSteps:
    """``model.step`` for one new token per sequence, replayed from a CUDA graph per batch
    size. The cache must have one slot beyond ``slots``: the padding rows' scratch."""

    def __init__(self, model: CausalLM, cache: KVCache, slots: int) -> None:
        if cache.keys.shape[1] != slots + 1:
            raise ValueError(f"a cache of {cache.keys.shape[1]} slots for {slots}: need slots + 1")
        self.model = model
        self.cache = cache
        self.scratch = slots  # the spare slot padding rows write to
        self.sizes = batch_sizes(slots)
        device = cache.keys.device
        largest = self.sizes[-1]
        # One set of input buffers, each graph reading its leading rows.
        self.ids = torch.zeros(largest, 1, dtype=torch.long, device=device)
        self.positions = torch.full((largest, 1), cache.max_len - 1, device=device)
        self.slots = torch.full((largest,), self.scratch, device=device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None  # the graphs' memory, shared: they never run at once

    def __call__(
        self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """Logits [rows, 1, vocab] of ``ids`` [rows, 1] at ``positions`` [rows, 1] of cache
        ``slots`` [rows] (any device). A view of the graph's output buffer: read it before
        the next call."""
        rows = ids.shape[0]
        size = next(s for s in self.sizes if s >= rows)
        self.ids[:rows].copy_(ids, non_blocking=True)
        self.positions[:rows].copy_(positions, non_blocking=True)
        self.slots[:rows].copy_(slots, non_blocking=True)
        if rows < size:
            self.positions[rows:size].fill_(self.cache.max_len - 1)
            self.slots[rows:size].fill_(self.scratch)
        graph, logits = self.graphs.get(size) or self._capture(size)
        graph.replay()
        return logits[:rows]

    def _step(self, size: int) -> torch.Tensor:
        return self.model.step(
            self.ids[:size],
            self.positions[:size],
            self.slots[:size],
            self.cache,
            span=self.cache.max_len,
        )

    def _capture(self, size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # A few steps outside capture first, on a side stream: kernels pick their
        # algorithms and libraries make their workspaces, which capture must not do.
        # The inputs then are whatever the buffers hold; rows beyond this call's write to
        # the scratch slot, and this call's own rows are written again by the replay.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(size)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._step(size)
        self.pool = graph.pool()
        self.graphs[size] = (graph, logits)
        return graph, logits
