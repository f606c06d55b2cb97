"""The distributed optimizer: AdamW's state split over a model's data-parallel copies.

Every copy of the model computes the same update from the same summed gradients, so a
whole AdamW state on each copy is two parameters' worth of float32 kept N times for one
use. With ``backends.megatron.distributed_optimizer`` each parameter belongs to one rank
of its data-parallel group (a dense parameter: the model's copies; an expert's: the ranks
that hold the same experts). Only that rank keeps its moments: the gradients are reduced
to it, it updates the parameter, and the new values are broadcast to the group before the
next forward. The arithmetic is what one copy would do, so the updated weights are the
same (to the rounding of a differently ordered gradient norm).

megatron-core's own ``DistributedOptimizer`` does this over the flat grad buffers of its
``DistributedDataParallel``, which it allocates on the current CUDA device; this one moves
whole parameters (bucketed per owner) with the collectives of the tensors' device, so the
same code runs on gloo and NCCL and is tested on CPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ...policy.collectives import all_gather_data

__all__ = ["DistributedOptimizer", "Share", "partition"]


def partition(sizes: Sequence[tuple[str, int]], ranks: int) -> dict[str, int]:
    """Each name's owner among ``ranks``: largest first, each to the least loaded rank
    (the lowest on a tie), so the ranks hold about equal shares and every member of a
    group computes the same split from the same names and sizes."""
    load = [0] * ranks
    owners: dict[str, int] = {}
    for name, size in sorted(sizes, key=lambda item: (-item[1], item[0])):
        owner = min(range(ranks), key=lambda r: (load[r], r))
        owners[name] = owner
        load[owner] += size
    return owners


@dataclass
class Share:
    """One data-parallel group's parameters (by this rank's names) and which member of
    the group updates each."""

    group: dist.ProcessGroup
    rank: int  # this rank's place in the group
    size: int
    params: dict[str, nn.Parameter]
    owners: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.owners = partition([(n, p.numel()) for n, p in self.params.items()], self.size)

    def buckets(self) -> list[tuple[int, list[str]]]:
        """(owner, names) with one dtype each, in the same order on every member."""
        by_owner: dict[tuple[int, str], list[str]] = {}
        for name, param in self.params.items():
            by_owner.setdefault((self.owners[name], str(param.dtype)), []).append(name)
        return [(owner, names) for (owner, _), names in sorted(by_owner.items())]

    def mine(self, name: str) -> bool:
        return self.owners[name] == self.rank

    def global_rank(self, owner: int) -> int:
        return dist.get_global_rank(self.group, owner)


class DistributedOptimizer:
    """Which of ``params`` this rank's optimizer updates, and the collectives around its
    step. ``dense`` is None with one copy of the model, ``experts`` with one rank per
    expert (or no experts): parameters in neither are this rank's alone."""

    def __init__(
        self, params: Iterable[nn.Parameter], dense: Share | None, experts: Share | None
    ) -> None:
        self.dense = dense
        self.experts = experts
        self._shares = [s for s in (dense, experts) if s is not None]
        others = {id(p): s.mine(n) for s in self._shares for n, p in s.params.items()}
        self._mine = [p for p in params if others.get(id(p), True)]
        self._mine_ids = {id(p) for p in self._mine}

    def parameters(self) -> list[nn.Parameter]:
        """This rank's share, for its optimizer."""
        return list(self._mine)

    def owns(self, param: nn.Parameter) -> bool:
        return id(param) in self._mine_ids

    def reduce_gradients(self) -> None:
        """Each gradient summed over the group onto its owner; the other ranks drop
        theirs (their optimizer neither reads nor keeps it)."""
        for share in self._shares:
            for owner, names in share.buckets():
                params = [share.params[n] for n in names]
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                flat = _flat(grads)
                dist.reduce(flat, dst=share.global_rank(owner), group=share.group)
                if owner == share.rank:
                    for param, part in zip(params, _parts(flat, params), strict=True):
                        param.grad = part
                else:
                    for param in params:
                        param.grad = None

    def broadcast_parameters(self) -> None:
        """After the owners' step: every member takes the updated values."""
        with torch.no_grad():
            for share in self._shares:
                for owner, names in share.buckets():
                    params = [share.params[n] for n in names]
                    flat = _flat([p.detach() for p in params])
                    dist.broadcast(flat, src=share.global_rank(owner), group=share.group)
                    if owner != share.rank:
                        for param, part in zip(params, _parts(flat, params), strict=True):
                            param.copy_(part)

    def everywhere(self, local: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Tensors shaped like the parameters (a moment), given for the ones this rank
        owns, for all of them: each from its owner (a collective over the groups)."""
        out = dict(local)
        for share in self._shares:
            for owner, names in share.buckets():
                params = [share.params[n] for n in names]
                if owner == share.rank:
                    flat = _flat([local.get(n, torch.zeros_like(share.params[n])) for n in names])
                else:
                    count = sum(p.numel() for p in params)
                    flat = torch.empty(count, dtype=params[0].dtype, device=params[0].device)
                dist.broadcast(flat, src=share.global_rank(owner), group=share.group)
                for name, part in zip(names, _parts(flat, params), strict=True):
                    out[name] = part
        return out

    def agreed(self, keys: Iterable[str], step: torch.Tensor | None, device: torch.device):
        """The moment names and the step count AdamW has on the ranks that own
        something: the same on every rank, before its first step none and None."""
        everyone = all_gather_data(sorted(keys), self._shares[0].group, device)
        if not all(isinstance(names, list) and all(isinstance(k, str) for k in names)
                   for names in everyone):  # fmt: skip
            raise ValueError("a rank's optimizer moment names are not names")
        named = sorted({k for names in everyone for k in names})
        count = torch.tensor(-1.0 if step is None else float(step), device=device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=self._shares[0].group)
        return named, (None if count < 0 else count.cpu())

    def sum_squares(self, dense: torch.Tensor, experts: torch.Tensor) -> None:
        """Squared gradient norms over this rank's share, summed over the groups in place
        (each parameter's gradient is on its owner alone)."""
        if self.dense is not None:
            dist.all_reduce(dense, group=self.dense.group)
        if self.experts is not None:
            dist.all_reduce(experts, group=self.experts.group)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _parts(flat: torch.Tensor, like: list[nn.Parameter]) -> list[torch.Tensor]:
    sizes = [p.numel() for p in like]
    return [part.view_as(p) for part, p in zip(flat.split(sizes), like, strict=True)]
