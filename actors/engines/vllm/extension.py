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

With LoRA (``model.lora``) a version is the adapters alone, and vLLM serves them as an
adapter on its unchanged base: :meth:`WeightLoading.asyncrl_load_adapter` builds vLLM's
``LoRAModel`` from the tensors (no adapter directory, no file) and puts it in place of
the adapter under the same id, which every request carries.

This module is imported by vLLM in its worker, by name; it imports only torch (vLLM's
LoRA classes inside the methods that use them).
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

    def asyncrl_zero_adapter(self, adapter_id: int, rank: int) -> None:
        """Register adapter ``adapter_id`` with every B zero: the base's outputs exactly
        (a LoRA run's version 0), so that requests carry the adapter from the start."""
        worker_lora = self.model_runner.lora_manager
        manager = worker_lora._adapter_manager
        zero = manager.create_dummy_lora(adapter_id, rank, worker_lora.embedding_modules)
        self._asyncrl_put_adapter(zero)

    def asyncrl_load_adapter(
        self,
        named: Iterable[tuple[str, torch.Tensor]],
        adapter_id: int,
        rank: int,
        alpha: float,
    ) -> int:
        """Put the adapters ``named`` (``<module>.lora_A.weight`` [rank, in] and
        ``<module>.lora_B.weight`` [out, rank], Hugging Face module names) in place of
        adapter ``adapter_id``, which then adds ``alpha / rank * B @ A`` to each module's
        weight; returns how many tensors. Anything but whole adapters of modules vLLM
        adapts is a ValueError, before anything changes."""
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        worker_lora = self.model_runner.lora_manager
        manager = worker_lora._adapter_manager
        # vLLM folds the scale into B in place: the caller's tensors (a receiver's buffer)
        # must stay as they are.
        tensors = {name: tensor.detach().clone() for name, tensor in named}
        _check_adapter_names(tensors, _adaptable(manager))
        modules = sorted({name.rsplit(".", 3)[0].rsplit(".", 1)[-1] for name in tensors})
        helper = PEFTHelper.from_dict({"r": rank, "lora_alpha": alpha, "target_modules": modules})
        helper.validate_legal(worker_lora.lora_config)
        mapper = getattr(manager.model, "hf_to_vllm_mapper", None)
        adapter = LoRAModel.from_lora_tensors(
            adapter_id,
            tensors,
            helper,
            device="cpu",
            dtype=worker_lora.lora_config.lora_dtype,
            model_vocab_size=worker_lora.vocab_size,
            weights_mapper=None if mapper is None else mapper.get_rename_mapper(),
            skip_prefixes=getattr(manager.model, "lora_skip_prefixes", None),
        )
        self._asyncrl_put_adapter(adapter)
        return len(tensors)

    def _asyncrl_put_adapter(self, adapter) -> None:
        manager = self.model_runner.lora_manager._adapter_manager
        # The old adapter leaves its slot and the new one takes it: the layers' stacked
        # A and B are written now, before the next step.
        manager.remove_adapter(adapter.id)
        manager.add_adapter(adapter)
        manager.activate_adapter(adapter.id)

    def _asyncrl_pack_tied_head(self) -> None:
        model = self.model_runner.model
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)


def _adaptable(manager) -> set[str]:
    """The module names (last part) that vLLM's LoRA layers of this model take, packed
    layers as the modules they pack (qkv_proj as q_proj, k_proj, v_proj)."""
    names = set()
    for module in manager.supported_lora_modules:
        names.update(manager.packed_modules_mapping.get(module, [module]))
    return names


def _check_adapter_names(tensors: dict[str, torch.Tensor], adaptable: set[str]) -> None:
    parts: dict[str, set[str]] = {}
    for name in tensors:
        module, _, part = name.removesuffix(".weight").rpartition(".")
        if not name.endswith(".weight") or part not in ("lora_A", "lora_B"):
            raise ValueError(
                f"an adapter version holds {name!r}: expected only <module>.lora_A.weight "
                "and <module>.lora_B.weight (a full-weights version for a LoRA engine?)"
            )
        if module.rsplit(".", 1)[-1] not in adaptable:
            raise ValueError(
                f"{name!r}: vLLM adapts no such module here; it adapts {sorted(adaptable)}"
            )
        parts.setdefault(module, set()).add(part)
    halves = sorted(m for m, got in parts.items() if got != {"lora_A", "lora_B"})
    if not parts or halves:
        raise ValueError(f"an adapter version needs lora_A and lora_B of each module: {halves[:3]}")
