"""Log-probabilities of chosen tokens from logits whose vocabulary is split over the
tensor-parallel ranks (rank r holds columns ``r * shard .. (r + 1) * shard``).

No rank ever holds a whole row of logits: each reduces its slice to a maximum and a sum
of exponentials, the ranks all-reduce those (and the chosen token's logit, which exactly
one rank holds), and ``log p = logit - max - log(sum exp)`` follows. With one rank it is
``log_softmax`` then ``gather``. The sums go through autograd-aware all-reduces, so the
result trains; the maximum only shifts the numbers and carries no gradient.

Every rank of the group computes the same loss from the result (it is replicated), so
the sums' backward passes each rank's gradient through as it is, as megatron's own
"reduce from the tensor-parallel region" does; an all-reduce of the gradients there
would count it once per rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["gather_vocab", "vocab_parallel_logprobs", "vocab_parallel_logprobs_and_entropy"]


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    vocab: int | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log p(``targets``) in float32, shaped like ``targets``.

    ``logits`` [..., shard]: this rank's slice of the vocabulary, in rank order over
    ``group`` (None: not split). ``vocab``: the real vocabulary, when the split padded it
    (padding columns are no tokens, so they get no probability).
    """
    return vocab_parallel_logprobs_and_entropy(logits, targets, group, vocab, temperature)[0]


def vocab_parallel_logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    vocab: int | None = None,
    temperature: float = 1.0,
    entropy: str = "off",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`vocab_parallel_logprobs`, and with ``entropy`` "measured" (no gradient) or
    "trained" the entropy of each row's distribution (None when "off").

    With ``z`` the shifted logits, ``Z = sum exp(z)`` and ``p = exp(z) / Z``, the entropy
    is ``log Z - sum(exp(z) * z) / Z``: one more sum per rank, all-reduced like ``Z``.
    """
    ranks = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    shard = logits.shape[-1]
    start = rank * shard
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    padded = None
    if vocab is not None and start + shard > vocab:
        padded = torch.arange(start, start + shard, device=logits.device) >= vocab
        logits = logits.masked_fill(padded, float("-inf"))
    peak = logits.detach().amax(dim=-1)
    if ranks > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - peak.unsqueeze(-1)
    exps = shifted.exp()
    total = exps.sum(dim=-1)
    mine = (targets >= start) & (targets < start + shard)
    local = (targets - start).clamp(0, shard - 1)
    # where, not a product: a padding column's -inf times 0 would be nan
    picked = torch.where(mine, shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1), 0.0)
    if ranks > 1:
        total = _SumOverRanks.apply(total, group)
        picked = _SumOverRanks.apply(picked, group)
    log_total = total.log()
    if entropy == "off":
        return picked - log_total, None
    with torch.set_grad_enabled(entropy == "trained" and torch.is_grad_enabled()):
        finite = shifted if padded is None else shifted.masked_fill(padded, 0.0)
        weighted = (exps.unsqueeze(-2) @ finite.unsqueeze(-1)).squeeze(-1).squeeze(-1)
        if ranks > 1:
            weighted = _SumOverRanks.apply(weighted, group)
        spread = log_total - weighted / total
    return picked - log_total, spread


class _SumOverRanks(torch.autograd.Function):
    """Forward: the sum over the group's ranks. Backward: the gradient as it is."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def gather_vocab(logits: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's vocabulary slice of ``logits`` joined along the last dimension, in
    rank order. Backward keeps this rank's slice of the gradient (the loss on the whole
    logits is replicated over the group). Gathered here rather than by megatron, whose
    gather allocates its buffer on the current CUDA device."""
    return _GatherVocab.apply(logits, group)


class _GatherVocab(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.rank, ctx.shard = dist.get_rank(group), logits.shape[-1]
        parts = [torch.empty_like(logits) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, logits.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        start = ctx.rank * ctx.shard
        return grad[..., start : start + ctx.shard].contiguous(), None
