"""A mixture of experts (Qwen3-MoE) in megatron-core's ``GPTModel``: the configuration
that routes as transformers does, and the two pieces of megatron's MoE layer replaced so
that it computes on CPU and over expert-parallel ranks holding different micro-batches.

- The router: megatron's ``Router.gating`` moves its weight to the current CUDA device
  when it finds it on CPU; ours computes where the weight is.
- The token dispatcher: megatron's all-gather dispatcher gathers every expert-parallel
  rank's tokens into a buffer of equal parts made on the current CUDA device. Ours gathers
  with plain ``torch.distributed`` calls, on the tokens' device, parts of any size: the
  expert-parallel ranks are data-parallel copies of the dense layers, and each trains or
  scores its own micro-batch, whose shape is its own.

Expert-parallel ranks are carved out of the data-parallel ones: each holds a contiguous
block of the experts (megatron's local numbering, as ``parallel.split_expert_parallel``)
and computes them on the tokens of every rank in its expert-parallel group.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher
from megatron.core.transformer.spec_utils import ModuleSpec

from asyncrl.actors.policy.config import ModelConfig

from .parallel import merge_expert_parallel

__all__ = ["gather_experts", "is_expert", "moe_fields", "use_our_dispatchers", "use_our_router"]

_EXPERT_PARAM = re.compile(r"\.mlp\.experts\.")


def is_expert(name: str) -> bool:
    """Whether a megatron parameter (by name) belongs to one expert, not to every copy."""
    return _EXPERT_PARAM.search(name) is not None


def moe_fields(config: ModelConfig) -> dict[str, Any]:
    """``TransformerConfig`` fields of ``config``'s experts ({} for a dense model)."""
    experts = config.experts
    if experts is None:
        return {}
    return {
        "num_moe_experts": experts.count,
        "moe_router_topk": experts.per_token,
        "moe_ffn_hidden_size": experts.intermediate_size,
        "moe_router_score_function": "softmax",
        # Renormalised over the chosen (norm_topk_prob): the softmax of the chosen logits,
        # which megatron computes after its top-k. Not renormalised: the softmax over all
        # experts, then the top-k of it, megatron's pre-softmax. Either way the same experts
        # and weights as transformers (the softmax keeps the logits' order).
        "moe_router_pre_softmax": not experts.normalize,
        # RL is trained here without the load-balancing loss, as by the torch engine (and
        # by transformers' Qwen3-MoE unless output_router_logits is set): the policy loss
        # alone moves the router.
        "moe_aux_loss_coeff": 0.0,
        "moe_router_load_balancing_type": "none",
        # Replaced by _TokenDispatcher, which is all-gather's with torch's own collectives.
        "moe_token_dispatcher_type": "allgather",
        "moe_grouped_gemm": False,
        # The gate's logits in the activations' dtype (None), as transformers computes
        # them: fp32 would route bfloat16 checkpoints slightly differently from their own.
        "moe_router_dtype": None,
        # Each router holds a RouterReplay, idle (routing by its own top-k) until the
        # model sets it to replay recorded routes (MegatronModel.token_logprobs).
        "moe_enable_routing_replay": True,
    }


def use_our_router(spec: ModuleSpec) -> None:
    """A layer spec's MoE block given :class:`_Router`."""
    mlp = spec.submodules.mlp
    if not (isinstance(mlp, ModuleSpec) and mlp.module is MoELayer):
        raise ValueError(f"the layer spec's MLP is {mlp!r}, not megatron's MoE layer")
    mlp.submodules.router = _Router


def use_our_dispatchers(model: torch.nn.Module) -> None:
    """Every MoE layer of ``model`` given :class:`_TokenDispatcher` (megatron makes its
    dispatcher from the configuration's type, so it is replaced once the model is made)."""
    for module in model.modules():
        if isinstance(module, MoELayer):
            module.token_dispatcher = _TokenDispatcher(
                module.num_local_experts,
                module.local_expert_indices,
                config=module.config,
                pg_collection=get_default_pg_collection(),
            )


class _Router(TopKRouter):
    """megatron's top-k router, computing where its weight is: megatron's own moves the
    weight to the current CUDA device, which a CPU run has not, and its gating function
    without Transformer Engine names a kernel it never imported."""

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(
            self.config.moe_router_dtype, input.dtype
        )
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(input.to(dtype), self.weight.to(dtype), bias)


class _TokenDispatcher(MoEAllGatherTokenDispatcher):
    """All-gather dispatch over the expert-parallel group in torch's collectives, each
    rank's tokens as many as it has: every rank computes its experts on every rank's
    tokens, and the summed outputs go back to the rank each token came from."""

    def token_dispatch(self, hidden_states: torch.Tensor, probs: torch.Tensor):
        group = self.tp_ep_group
        if group.size() == 1:
            return hidden_states, probs
        self.counts = _row_counts(hidden_states.shape[0], group, hidden_states.device)
        with torch.no_grad():
            routed = _gather_rows(self.routing_map.to(torch.uint8), group, self.counts)
            self.routing_map = routed.bool()  # gloo gathers no bool tensors
        probs = _GatherRows.apply(probs, group, self.counts)
        hidden_states = _GatherRows.apply(hidden_states, group, self.counts)
        return hidden_states, probs

    def token_combine(self, hidden_states: torch.Tensor) -> torch.Tensor:
        group = self.tp_ep_group
        if group.size() == 1:
            return hidden_states
        summed = _SumRows.apply(hidden_states.to(self.local_probs.dtype), group, self.counts)
        return summed.to(hidden_states.dtype)


# --- collectives over parts of different sizes ------------------------------------------


def _row_counts(rows: int, group: dist.ProcessGroup, device: torch.device) -> list[int]:
    mine = torch.tensor([rows], dtype=torch.long, device=device)
    every = [torch.empty_like(mine) for _ in range(group.size())]
    dist.all_gather(every, mine, group=group)
    return [int(count) for count in every]


def _gather_rows(part: torch.Tensor, group: dist.ProcessGroup, counts: list[int]) -> torch.Tensor:
    """Every rank's rows in rank order (parts padded to the longest for the gather)."""
    padded = part.new_zeros(max(counts), *part.shape[1:])
    padded[: part.shape[0]] = part
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:count] for p, count in zip(parts, counts, strict=True)])


def _sum_rows(whole: torch.Tensor, group: dist.ProcessGroup, counts: list[int]) -> torch.Tensor:
    """This rank's rows of the sum of every rank's ``whole`` (a reduce-scatter of parts of
    any size, which gloo has not)."""
    total = whole.contiguous().clone()
    dist.all_reduce(total, group=group)
    rank = dist.get_rank(group)
    start = sum(counts[:rank])
    return total[start : start + counts[rank]]


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, part: torch.Tensor, group: dist.ProcessGroup, counts: list[int]):
        ctx.group, ctx.counts = group, counts
        return _gather_rows(part, group, counts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every rank's gradient of this rank's rows, summed.
        return _sum_rows(grad, ctx.group, ctx.counts), None, None


class _SumRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, whole: torch.Tensor, group: dist.ProcessGroup, counts: list[int]):
        ctx.group, ctx.counts = group, counts
        return _sum_rows(whole, group, counts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _gather_rows(grad.contiguous(), ctx.group, ctx.counts), None, None


def gather_experts(
    state: Mapping[str, torch.Tensor], group: dist.ProcessGroup, ranks: int
) -> dict[str, torch.Tensor]:
    """``state`` (one expert-parallel rank's, megatron's local names) with every rank's
    experts, numbered as in the whole model; a collective over the expert-parallel group.
    The other tensors are the same on every rank of it: this rank's are kept."""
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(ranks)]
    for name in sorted(state):  # every rank holds the same names and shapes
        tensor = state[name]
        if not is_expert(name):
            shards[0][name] = tensor
            continue
        parts = [torch.empty_like(tensor) for _ in range(ranks)]
        dist.all_gather(parts, tensor.contiguous(), group=group)
        for rank, part in enumerate(parts):
            shards[rank][name] = part
    return merge_expert_parallel(shards)
