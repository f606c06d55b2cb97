"""A megatron model's weights by Hugging Face name: whole weights out of this rank's part
(gathered over tensor- and expert-parallel ranks and pipeline stages), and this rank's
part taken out of whole weights."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_model import GPTModel

from .experts import gather_experts
from .gathers import every_stage, every_tensor_parallel_rank
from .gpt_build import ParallelSizes
from .mapping import (
    Layout,
    from_te_names,
    hf_to_megatron,
    megatron_to_hf,
    slice_to_hf,
    to_te_names,
)
from .parallel import (
    merge_pipeline_parallel,
    merge_tensor_parallel,
    split_expert_parallel,
    split_pipeline_parallel,
    split_tensor_parallel,
)
from .stage_links import Stages

__all__ = ["HfWeights"]


class HfWeights:
    """Weights in and out by Hugging Face name, as a base of :class:`~.model.MegatronLM`."""

    gpt: GPTModel
    sizes: ParallelSizes
    layout: Layout
    te: bool
    stages: Stages | None
    device: torch.device

    def hf_state(self) -> dict[str, torch.Tensor]:
        """Every parameter by Hugging Face name, whole; a tied output layer once. With
        tensor- or expert-parallel ranks or pipeline stages a collective over them (every
        rank gets the whole)."""
        return self._whole(
            {k: t.detach() for k, t in self.gpt.state_dict().items() if _is_tensor(t)}
        )

    def hf_part_index(self) -> int | None:
        """Stage by stage, expert-parallel rank by rank, tensor-parallel rank by rank: the
        first copy of the model (of its experts, with expert-parallel ranks, which are
        carved out of the data-parallel copies) publishes, the other copies nothing."""
        if parallel_state.get_expert_data_parallel_rank() != 0:
            return None
        stage = self.stages.stage if self.stages is not None else 0
        expert = self._expert_parallel_rank()
        return (stage * self.sizes.expert + expert) * self.sizes.tensor + (
            self._tensor_parallel_rank()
        )

    def hf_part(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """This rank's own slice by Hugging Face name (mapping.slice_to_hf), no collective:
        its tensor-parallel rows and columns of its stage's layers, and its experts."""
        state = {k: t.detach() for k, t in self.gpt.state_dict().items() if _is_tensor(t)}
        if self.te:
            state = from_te_names(state, self.layout)
        stages = self.stages.count if self.stages is not None else 1
        first = (self.stages.stage if self.stages is not None else 0) * (
            self.layout.layers // stages
        )
        return slice_to_hf(
            state,
            self.layout,
            self._tensor_parallel_rank(),
            self.sizes.tensor,
            first,
            self._expert_parallel_rank(),
            self.sizes.expert,
        )

    def _expert_parallel_rank(self) -> int:
        if self.sizes.expert == 1:
            return 0
        return parallel_state.get_expert_model_parallel_rank()

    def _tensor_parallel_rank(self) -> int:
        if self.sizes.tensor == 1:
            return 0
        return parallel_state.get_tensor_model_parallel_rank()

    def load_hf_state(self, hf: Mapping[str, torch.Tensor]) -> None:
        """Whole Hugging Face weights into the model (each stage takes its layers, each
        tensor-parallel rank its part of them, each expert-parallel rank its experts); a
        missing or unexpected tensor is named."""
        state = self._mine(hf)
        params = dict(self.gpt.named_parameters())
        missing = set(params) - set(state)
        unexpected = set(state) - set(params)
        if missing or unexpected:
            raise ValueError(
                f"weights do not fit the megatron model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}"
            )
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)

    def _whole(self, local: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Tensors shaped like this rank's parameters, whole and by Hugging Face name."""
        state = dict(local)
        if self.te:
            state = from_te_names(state, self.layout)
        if self.sizes.tensor > 1:
            state = merge_tensor_parallel(every_tensor_parallel_rank(state, self.sizes.tensor))
        if self.sizes.expert > 1:
            group = parallel_state.get_expert_model_parallel_group()
            state = gather_experts(state, group, self.sizes.expert)
        if self.stages is not None:
            every = every_stage(state, self.stages, self.device)
            state = merge_pipeline_parallel(every, self.layout)
        return megatron_to_hf(state, self.layout)

    def _mine(self, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's part of whole tensors named by Hugging Face, by parameter name."""
        state = hf_to_megatron(hf, self.layout)
        if self.stages is not None:
            state = split_pipeline_parallel(state, self.layout, self.stages.count)
            state = state[self.stages.stage]
        if self.sizes.expert > 1:
            rank = parallel_state.get_expert_model_parallel_rank()
            state = split_expert_parallel(state, self.sizes.expert)[rank]
        if self.sizes.tensor > 1:
            rank = parallel_state.get_tensor_model_parallel_rank()
            state = split_tensor_parallel(state, self.sizes.tensor)[rank]
        return to_te_names(state, self.layout) if self.te else state


def _is_tensor(value: object) -> bool:
    return isinstance(value, torch.Tensor)  # megatron's _extra_state entries are not
