"""A learner's state in and out: the whole weights and optimizer state (a checkpoint's,
a published version's; collectives in a group), and this rank's own part of them as it
is (what staging a step copies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..engines.contract import EngineModel, load_group_weights, load_weights, weights_of
from ..policy.lora import is_adapter, published_name, trainer_name
from ..policy.model import CausalLM
from ..policy.sharding import full_tensor, is_dtensor, local_part, state_dicts
from .host_copies import HostCopies

__all__ = ["LearnerState", "OwnPart"]


@dataclass(frozen=True)
class OwnPart:
    """A rank's part of a version published from every rank."""

    index: int  # among the publishing ranks: where receivers lay it
    tensors: dict[str, torch.Tensor]
    dims: dict[str, int]  # each tensor's split dimension, where not 0
    # Each tensor's whole shape, where this rank knows every one (an FSDP2 rank); None:
    # the parts' slices add up to it (a pipeline stage knows only its own layers).
    shapes: dict[str, tuple[int, ...]] | None


class LearnerState:
    """The state's ins and outs, as a base of :class:`~.learner.Learner`."""

    model: CausalLM | EngineModel
    engine: EngineModel | None
    optimizer: torch.optim.Optimizer
    compute_dtype: torch.dtype
    device: torch.device
    size: int
    rank: int
    lora: bool  # versions and checkpoints are the adapters alone (model.lora)
    _host: HostCopies

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Every parameter whole, by Hugging Face name, a tied output layer once (as a
        checkpoint stores it), in ``model.dtype`` (what generators run: the float32
        master weights rounded); on the leader (the others get nothing).

        With a group this is a collective: every rank must call it at the same point.
        """
        dtype = self.compute_dtype
        if self.lora:
            return self._full_adapters()
        if self.size == 1 or self.engine is not None:
            # With another engine's group, a collective; only the leader keeps the result.
            weights = weights_of(self.model)
            if self.rank != 0:
                return {}
            weights = {name: t.to(dtype) for name, t in weights.items()}
            if self.device.type == "cuda":  # the weight plane stages from CPU memory
                weights = self._host.copy(weights)
            return weights
        dcp = state_dicts()
        options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = dcp.get_model_state_dict(self.model, options=options)
        if self.model.config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        return {name: t.to(dtype) for name, t in weights.items()}

    def part_index(self) -> int | None:
        """This rank's place among the ranks publishing a version from every rank
        (``weights.from_every_rank``); None for a copy of the model that publishes
        nothing (another engine's data-parallel copies)."""
        if self.engine is not None:
            return self.engine.hf_part_index()
        return self.rank

    def own_part(self) -> OwnPart | None:
        """This rank's part of a version (``weights.from_every_rank``): its slice of every
        tensor :meth:`full_weights` would give, named and typed as there, in CPU memory
        (an FSDP2 shard's rows; another engine's own slice, split along the dimension it
        says); None on a rank that publishes nothing. No collective: each rank publishes
        its own (transport/weights/parts.py)."""
        index = self.part_index()
        if index is None:
            return None
        if self.engine is not None:
            tensors, dims = self.engine.hf_part()
            part = {name: t.detach().to(self.compute_dtype) for name, t in tensors.items()}
            return OwnPart(index, self._on_host(part), dims, None)
        state = self.model.state_dict()
        if self.model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        part = {}
        shapes: dict[str, tuple[int, ...]] = {}
        for name, value in state.items():
            shapes[name] = tuple(value.shape)
            if is_dtensor(value) and value.placements[0].is_shard(0):
                part[name] = value.to_local().detach().to(self.compute_dtype)
            elif self.rank == 0:  # whole on every rank: rank 0's part holds it
                part[name] = local_part(value).detach().to(self.compute_dtype)
        return OwnPart(index, self._on_host(part), {}, shapes)

    def _on_host(self, part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.device.type == "cuda":  # the weight plane stages from CPU memory
            return self._host.copy(part)
        return part

    def _full_adapters(self) -> dict[str, torch.Tensor]:
        """A LoRA run's version: the adapters alone, whole, by published name (lora.py),
        on the leader. Each is gathered by itself: the frozen base is never gathered."""
        adapters = {}
        for name, param in self.model.named_parameters():
            if is_adapter(name):
                adapters[published_name(name)] = full_tensor(param.detach()).to(self.compute_dtype)
        if self.rank != 0:
            return {}
        if self.device.type == "cuda":  # the weight plane stages from CPU memory
            return self._host.copy(adapters)
        return {name: t.clone() for name, t in adapters.items()}

    def full_optimizer_state(self) -> dict[str, Any]:
        """AdamW's state keyed by parameter name, whole; a collective with a group."""
        if self.engine is not None:
            return self.engine.optimizer_state(self.optimizer)
        dcp = state_dicts()
        options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=self.size > 1)
        return dcp.get_optimizer_state_dict(self.model, self.optimizer, options=options)

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Every rank passes the whole state (read from the checkpoint); each keeps its shard."""
        if self.engine is not None:
            self.engine.load_optimizer_state(self.optimizer, state)
            return
        dcp = state_dicts()
        options = dcp.StateDictOptions(full_state_dict=True)
        dcp.set_optimizer_state_dict(self.model, self.optimizer, state, options=options)

    def load_full_weights(self, whole: dict[str, torch.Tensor] | None) -> None:
        """Whole weights (a checkpoint's) into the model; with a group rank 0 passes them
        and the others None, and each rank keeps its shard (a collective). A LoRA run's
        checkpoint holds the adapters alone (published names): the base stays as loaded."""
        if self.lora:
            self._load_adapters(whole)
        elif self.size == 1:
            assert whole is not None
            load_weights(self.model, whole)
        else:
            load_group_weights(self.model, whole)

    def _load_adapters(self, whole: dict[str, torch.Tensor] | None) -> None:
        if self.size == 1:
            assert whole is not None
            whole = {trainer_name(name): t for name, t in whole.items()}
            params = dict(self._trained())
            if whole.keys() != params.keys():
                raise ValueError(
                    f"a checkpoint's adapters do not fit the model's: "
                    f"{sorted(whole.keys() ^ params.keys())[:3]}"
                )
            with torch.no_grad():
                for name, param in params.items():
                    param.copy_(whole[name])
            return
        state = {} if whole is None else {trainer_name(n): t for n, t in whole.items()}
        # strict=False: the state names the adapters alone, the base is not touched.
        dcp = state_dicts()
        options = dcp.StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True, strict=False
        )
        dcp.set_model_state_dict(self.model, state, options=options)

    def _trained(self):
        """(name, parameter) of what the optimizer updates: every parameter, or with
        LoRA the adapters (the frozen base is the base model's, reloaded at start)."""
        return ((n, p) for n, p in self.model.named_parameters() if p.requires_grad)

    def local_state(self) -> dict[str, torch.Tensor]:
        """This rank's part of the state, as it is (no copy, no collective): its shard of
        every trained parameter and of AdamW's state, by name. What staging a step copies."""
        out: dict[str, torch.Tensor] = {}
        for name, param in self._trained():
            out[f"param/{name}"] = local_part(param.detach())
            for key, value in sorted(self.optimizer.state.get(param, {}).items()):
                out[f"adam/{name}/{key}"] = local_part(value)
        return out

    def load_local_state(self, state: dict[str, torch.Tensor]) -> None:
        """Put back what :meth:`local_state` gave (on a learner of the same layout)."""
        names = {f"param/{name}" for name, _ in self._trained()}
        missing = names - set(state)
        if missing:
            raise ValueError(f"a staged state without parameters {sorted(missing)[:3]}")
        # Parameters this learner does not train (a critic cut or frozen otherwise since):
        # taking the rest would resume another model than the one staged.
        extra = {key for key in state if key.startswith("param/")} - names
        if extra:
            raise ValueError(
                f"a staged state with parameters this learner does not train {sorted(extra)[:3]}"
            )
        with torch.no_grad():
            for name, param in self._trained():
                local_part(param).copy_(state[f"param/{name}"])
                adam = {k.split("/")[-1]: t for k, t in state.items() if _of(k, name)}
                if adam:
                    self.optimizer.state[param] = {
                        key: self._like(param, value) for key, value in adam.items()
                    }

    def _like(self, param: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """A staged optimizer tensor as AdamW keeps it: a moment shaped (and sharded) like
        its parameter, or a scalar (the step) on the device it was staged from."""
        if value.shape == local_part(param).shape and value.dim() > 0:
            out = torch.zeros_like(param)  # a DTensor with the parameter's sharding
            local_part(out).copy_(value)
            return out
        return value.clone()


def _of(key: str, param: str) -> bool:
    return key.startswith(f"adam/{param}/") and "/" not in key[len(f"adam/{param}/") :]
