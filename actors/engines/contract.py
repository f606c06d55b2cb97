"""What the learner and the scorers need of a model, whichever engine holds it: ours (a
:class:`~asyncrl.actors.policy.model.CausalLM`) or another engine's, which meets
:class:`EngineModel`; and the few operations that differ between the two (where it
computes, its weights by Hugging Face name, its split over a group of ranks)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from ..policy.model import CausalLM, Decoder, Entropy, ModelConfig
    from ..policy.sampling import Sampling

__all__ = [
    "EngineModel",
    "copy_of",
    "device_of",
    "load_group_weights",
    "load_weights",
    "split_over_group",
    "weights_of",
]


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

    def hf_part_index(self) -> int | None:
        """This rank's place among the ranks that publish a version from every rank, in
        the order receivers lay the parts; None for a copy that publishes nothing."""
        ...

    def hf_part(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """This rank's own slice of :meth:`hf_state` (no collective) and each tensor's
        split dimension where not 0 (transport/weights/parts.py)."""
        ...

    def load_hf_state(self, state: Mapping[str, torch.Tensor]) -> None: ...

    def token_logprobs(
        self,
        input_ids: torch.Tensor,
        columns: torch.Tensor,
        targets: torch.Tensor,
        sampling: Sampling,
        entropy: Entropy = "off",
        routes: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """log p(``targets`` [batch, k]) at ``columns`` [batch, k], float32, under the
        distribution ``sampling`` draws from (``sampled_logprobs``); with ``entropy``
        "measured" (no gradient) or "trained", also (log-probs, entropies) of that
        distribution at each position. ``routes`` [layers, batch, tokens, per_token]: a
        mixture of experts routes each token through those (router replay)."""
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
        loss_of: Callable[[int, torch.Tensor, torch.Tensor | None], torch.Tensor],
        sampling: Sampling,
        autocast: Callable[[], AbstractContextManager],
        entropy: Entropy = "off",
    ) -> None:
        """Forward and backward of every micro-batch (token ids, columns, targets) through
        the stages; ``loss_of(m, log-probs, entropies)`` gives a micro-batch's loss on the
        stage that has its log-probs (entropies None when ``entropy`` is "off")."""
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
