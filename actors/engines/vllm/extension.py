"""Methods vLLM mixes into its worker class (``worker_extension_cls``), called through
``collective_rpc``: a new version's weights loaded in place.

The weights go through vLLM's own in-place reload (``Worker.reload_weights``), which loads
checkpoint-format tensors (Hugging Face names) layer by layer and then redoes what vLLM
does after a load: on CPU it packs each linear layer's weight for its matrix kernels and
drops the unpacked copy, so a plain ``model.load_weights`` after start-up fails (the
parameters it would copy into are empty). One thing the reload misses, measured with vLLM
0.32.0 on CPU: with tied embeddings, the output layer keeps a packed copy of the old
embedding, so logits come from the old version; it is packed again here after each load
(when the head is not tied this only repeats vLLM's own packing).

Two ways in: tensors passed as they are (the engine in this process: ``collective_rpc``
hands the objects over unserialized), or a file in shared memory that the worker maps
itself (an engine core in another process: its RPC does not carry tensors, and the path
costs no copy on the way).

This module is imported by vLLM in its worker, by name; it imports only torch.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterable, Sequence

import torch

__all__ = ["WEIGHT_LOADING", "MappedTensor", "WeightLoading"]

# The qualified name vLLM is given (EngineArgs.worker_extension_cls).
WEIGHT_LOADING = f"{__name__}.WeightLoading"

# One tensor in a mapped file: (Hugging Face name, torch dtype name, shape, byte offset).
MappedTensor = tuple[str, str, Sequence[int], int]


class WeightLoading:
    """Mixed into vLLM's worker: ``self`` is the worker, with its ``model_runner``."""

    def asyncrl_load(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load ``(name, tensor)`` pairs, Hugging Face names; returns how many."""
        named = list(named)
        self.reload_weights(weights_iterator=iter(named), is_checkpoint_format=True)
        self._asyncrl_pack_tied_head()
        return len(named)

    def asyncrl_load_mapped(self, path: str, layout: Sequence[MappedTensor]) -> int:
        """Load the tensors that ``layout`` places in the file at ``path`` (read only)."""
        with open(path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        whole = memoryview(mapped)
        named = []
        for name, dtype_name, shape, offset in layout:
            dtype = getattr(torch, dtype_name, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"{name}: dtype {dtype_name!r} is not a torch dtype")
            nbytes = math.prod(shape) * dtype.itemsize
            if offset + nbytes > len(whole):
                raise ValueError(
                    f"{name}: bytes {offset}..{offset + nbytes} lie past the end of {path} "
                    f"({len(whole)} bytes)"
                )
            view = whole[offset : offset + nbytes]
            named.append((name, torch.frombuffer(view, dtype=dtype).view(tuple(shape))))
        # The mapping is not closed here: the reload may still hold views of it, and it
        # goes with the last of them.
        return self.asyncrl_load(named)

    def _asyncrl_pack_tied_head(self) -> None:
        model = self.model_runner.model
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)
