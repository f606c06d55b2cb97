"""Engines other than the built-in PyTorch model: SGLang for generation
(``backends.generate``), megatron-core for train, logp and ref_logp (``backends.train``).

Each engine is a package that imports its own library only when the engine is started,
so the default install never imports, or needs, any of them. An SGLang decoder has the
surface of :class:`asyncrl.actors.policy.decoder.Decoder`, so the generate role, episodes
and validation drive it the same way; a training engine's model meets
:class:`EngineModel`, what the learner and the scorers use. What a role of a training
engine asks before it starts is answered here, in one place.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from asyncrl.runtime.contract.config import MegatronSection, RunConfig

if TYPE_CHECKING:
    from ..policy.config import Experts
    from ..policy.model import CausalLM, Decoder, ModelConfig

__all__ = [
    "MEGATRON_MISSING",
    "EngineModel",
    "copy_of",
    "device_of",
    "load_group_weights",
    "load_weights",
    "split_over_group",
    "train_engine_problems",
    "weights_of",
]

MEGATRON_MISSING = "backends.train='megatron' needs megatron-core: pip install 'asyncrl[gpu]'"


def train_engine_problems(cfg: RunConfig, role: str) -> list[str]:
    """Why ``role`` cannot run on ``backends.train`` here, one line each; [] if it can."""
    if cfg.backends.train == "torch":
        return []
    missing = _megatron_missing()
    if missing:
        return [missing]
    m = cfg.backends.megatron
    if m.expert_parallel > 1 and m.tensor_parallel > 1:
        # megatron asks for sequence parallelism with both, which is not wired.
        return [
            f"backends.megatron: expert_parallel={m.expert_parallel} with "
            f"tensor_parallel={m.tensor_parallel}: megatron needs sequence parallelism for "
            "both, which is not wired; use one of them"
        ]
    return _expert_problems(cfg.backends.megatron, cfg.model.path)


def _expert_problems(m: MegatronSection, path: str) -> list[str]:
    """What the model at ``path`` (its experts, or none) rules out of ``m``'s split."""
    if m.tensor_parallel == 1 and m.expert_parallel == 1:
        return []
    readable, experts = _experts_of(path)
    if not readable:
        return []  # the model's own check names that
    if experts is not None and m.tensor_parallel > 1:
        # megatron's MoE layer trains over tensor-parallel ranks only with sequence
        # parallelism (it raises otherwise), which this engine does not wire.
        return [
            f"backends.megatron.tensor_parallel={m.tensor_parallel} with the "
            f"mixture-of-experts model at model.path={path!r}: megatron splits its experts "
            "over tensor-parallel ranks only with sequence parallelism, which is not wired; "
            "use tensor_parallel=1 (expert_parallel splits the experts)"
        ]
    if m.expert_parallel == 1:
        return []
    if experts is None:
        return [
            f"backends.megatron.expert_parallel={m.expert_parallel}: the model at "
            f"model.path={path!r} has no experts to split; use 1"
        ]
    if experts.count % m.expert_parallel:
        return [
            f"backends.megatron.expert_parallel={m.expert_parallel}: the {experts.count} "
            f"experts of the model at model.path={path!r} do not split evenly over "
            f"{m.expert_parallel} ranks; use a divisor of {experts.count}"
        ]
    return []


def _experts_of(path: str) -> tuple[bool, Experts | None]:
    """(whether ``model.path``'s config.json reads as a model of ours, its experts)."""
    import json

    from ..policy.config import ModelConfig
    from ..policy.directories import packaged_or_path

    try:
        config = json.loads((packaged_or_path(path) / "config.json").read_text())
        return True, ModelConfig.from_hf(config).experts
    except (OSError, ValueError, KeyError):
        return False, None


def _megatron_missing() -> str | None:
    """MEGATRON_MISSING unless megatron-core is installed (found, not imported: importing
    it takes seconds and warns about the optional packages it does without)."""
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:  # no megatron package at all
        found = False
    return None if found else MEGATRON_MISSING


# --- what the learner and the scorers need of a model, whichever engine holds it --------


@runtime_checkable
class EngineModel(Protocol):
    """A model held by another engine than ours, as the learner and the scorers use it:
    called with token ids (and optionally the columns wanted) it gives logits, like
    :class:`~asyncrl.actors.policy.model.CausalLM`, and it computes the log-probs of
    chosen tokens its own way; its weights go in and out whole, by Hugging Face name, a
    tied output layer once."""

    config: ModelConfig

    @property
    def device(self) -> torch.device: ...

    def hf_state(self) -> dict[str, torch.Tensor]: ...

    def load_hf_state(self, state: Mapping[str, torch.Tensor]) -> None: ...

    def token_logprobs(
        self,
        input_ids: torch.Tensor,
        columns: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """log p(``targets`` [batch, k]) at ``columns`` [batch, k], float32."""
        ...

    # Training, where the engine may split the model over a group of ranks:

    def data_parallel(self) -> tuple[int, int, Any]:
        """(this rank's copy of the model, copies, the copies' process group or None)."""
        ...

    @property
    def pipelined(self) -> bool:
        """Whether the model is split into pipeline stages: training then goes through
        :meth:`train_in_stages` rather than a forward and a backward per micro-batch."""
        ...

    def train_in_stages(
        self,
        batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        loss_of: Callable[[int, torch.Tensor], torch.Tensor],
        temperature: float,
        autocast: Callable[[], AbstractContextManager],
    ) -> None:
        """Forward and backward of every micro-batch (token ids, columns, targets) through
        the stages; ``loss_of(m, log-probs)`` gives a micro-batch's loss on the stage that
        has its log-probs."""
        ...

    def from_last_stage(self, tensor: torch.Tensor) -> None:
        """``tensor`` as the last pipeline stage has it, on every stage (in place)."""
        ...

    def optimized_parameters(self) -> list[torch.nn.Parameter]:
        """What this rank's optimizer updates (a share of the copies' parameters, when the
        engine splits the optimizer's state over them); asked once, by the learner."""
        ...

    def finish_gradients(self) -> None:
        """After the micro-batches: sum the gradients over the copies."""
        ...

    def finish_step(self) -> None:
        """After the optimizer's step: the copies take the parameters updated elsewhere."""
        ...

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """The whole model's gradient norm; gradients scaled to ``max_norm`` if above."""
        ...

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer's state whole (a collective over the group)."""
        ...

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, whole: dict) -> None:
        """:meth:`optimizer_state`'s result into ``optimizer``, this rank its part."""
        ...


def device_of(model: Decoder | EngineModel) -> torch.device:
    """Where ``model`` computes: its inputs go there."""
    if isinstance(model, EngineModel):
        return model.device
    return model.model.embed_tokens.weight.device


def weights_of(model: CausalLM | EngineModel) -> dict[str, torch.Tensor]:
    """Every parameter by Hugging Face name, a tied output layer once (a checkpoint's)."""
    if isinstance(model, EngineModel):
        return model.hf_state()
    from ..policy.checkpoint import state_for_saving

    return state_for_saving(model)


def load_weights(
    model: CausalLM | EngineModel, state: Mapping[str, torch.Tensor], *, copy: bool = True
) -> list[torch.Tensor]:
    """``state`` into ``model`` (see :func:`~asyncrl.actors.policy.checkpoint.load_state`;
    another engine's layout always takes a copy, so nothing is superseded)."""
    if isinstance(model, EngineModel):
        model.load_hf_state(state)
        return []
    from ..policy.checkpoint import load_state

    return load_state(model, state, copy=copy)


# --- a model split over a group of ranks ---------------------------------------------


def split_over_group(model: CausalLM | EngineModel, ranks: int) -> None:
    """Split ``model`` over the ``ranks`` of the default group: ours by FSDP2; another
    engine's model split itself when it was built."""
    if not isinstance(model, EngineModel):
        from ..policy.sharding import shard

        shard(model, device_of(model), ranks)


def copy_of(model: CausalLM | EngineModel, rank: int, ranks: int) -> tuple[int, int]:
    """(this rank's copy of the model, copies) in a group of ``ranks``: every rank is its
    own copy of a sharded model of ours (FSDP2 gathers the layers it computes); ranks
    that hold parts of one copy of another engine's model compute together."""
    if isinstance(model, EngineModel):
        part, parts, _ = model.data_parallel()
        return part, parts
    return rank, ranks


def load_group_weights(
    model: CausalLM | EngineModel, whole: Mapping[str, torch.Tensor] | None
) -> None:
    """Whole weights into a model split over a group: rank 0 passes them, the others
    None, and each rank keeps its part. A collective."""
    if not isinstance(model, EngineModel):
        from ..policy.sharding import load_into_shards

        load_into_shards(model, whole)
        return
    import torch.distributed as dist

    from ..policy.collectives import broadcast_data, layout_of, read_layout

    # Rank 0 says what it sends (names, shapes, dtypes), the others receive into that: no
    # rank gathers the whole model only to learn its shapes.
    described = broadcast_data(None if whole is None else layout_of(whole), 0, None, model.device)
    state = {}
    for name, (shape, dtype) in sorted(read_layout(described).items()):
        if whole is None:
            tensor = torch.empty(shape, dtype=dtype, device=model.device)
        else:
            tensor = whole[name].to(model.device).contiguous()
        dist.broadcast(tensor, src=0)
        state[name] = tensor
    model.load_hf_state(state)
