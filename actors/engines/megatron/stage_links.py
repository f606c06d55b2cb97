"""A forward pass spread over pipeline stages, as one autograd graph across processes.

megatron-core's own schedules (``pipeline_parallel.get_forward_backward_func``) do not
run on CPU: their point-to-point layer allocates its receive buffers and shape tensors on
``torch.cuda.current_device()`` (``p2p_communication.py``, ``_communicate`` and
``_communicate_shapes``). Here the links between stages are autograd functions instead,
so a forward (and a backward) per micro-batch runs as it does for one rank, on gloo and
NCCL alike:

- a stage after the first receives its input from the previous stage; backward sends
  that input's gradient back;
- a stage before the last sends its output on; backward receives the output's gradient;
- the last stage's result (log-probs, or logits) is broadcast to every stage, so each
  has the same result; only the last stage's copy leads into the model, the others lead
  only to the send whose backward pulls the gradient in.

Scoring runs this way. Training runs the stages overlapped instead (:mod:`.schedule`,
1F1B); ``MegatronLM.overlap_stages = False`` trains through these links, one
micro-batch in flight at a time, for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state

__all__ = ["Stages"]


@dataclass(frozen=True)
class Stages:
    """This rank's place in its pipeline: the stage ranks are global ranks."""

    stage: int
    count: int
    group: dist.ProcessGroup
    previous: int
    following: int
    last_rank: int

    @classmethod
    def current(cls) -> Stages:
        """From megatron's groups (made with the pipeline size)."""
        return cls(
            stage=parallel_state.get_pipeline_model_parallel_rank(),
            count=parallel_state.get_pipeline_model_parallel_world_size(),
            group=parallel_state.get_pipeline_model_parallel_group(),
            previous=parallel_state.get_pipeline_model_parallel_prev_rank(),
            following=parallel_state.get_pipeline_model_parallel_next_rank(),
            last_rank=parallel_state.get_pipeline_model_parallel_last_rank(),
        )

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.count - 1

    def global_rank(self, stage: int) -> int:
        return dist.get_global_rank(self.group, stage)

    def receive(
        self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """The previous stage's output (its gradient goes back to it in backward)."""
        # A fresh leaf that asks for a gradient makes the function's output ask for one,
        # so autograd calls its backward (the send of the input's gradient).
        anchor = torch.empty(0, device=device, requires_grad=torch.is_grad_enabled())
        return _Receive.apply(anchor, shape, dtype, self.previous)

    def send(self, output: torch.Tensor) -> torch.Tensor:
        """``output`` to the next stage; a scalar link whose backward pulls the output's
        gradient in from there (0 in forward)."""
        return _Send.apply(output, self.following)

    def from_last(
        self, result: torch.Tensor | None, link: torch.Tensor | None, shape, dtype
    ) -> torch.Tensor:
        """The last stage's ``result`` on every stage of the pipeline. On the last stage
        the gradient passes through as it is; elsewhere the result hangs on ``link``
        (this stage's send) so that backward reaches it."""
        if self.last:
            assert result is not None
            return _BroadcastFromLast.apply(result, self.group, self.last_rank)
        assert link is not None
        return _ReceiveFromLast.apply(link, shape, dtype, self.group, self.last_rank)


class _Receive(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, shape, dtype, source: int) -> torch.Tensor:
        ctx.source = source
        buffer = torch.empty(shape, dtype=dtype, device=anchor.device)
        dist.recv(buffer, src=source)
        return buffer

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dist.send(grad.contiguous(), dst=ctx.source)
        return None, None, None, None


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(ctx, output: torch.Tensor, target: int) -> torch.Tensor:
        ctx.target, ctx.shape, ctx.dtype = target, output.shape, output.dtype
        dist.send(output.contiguous(), dst=target)
        return output.new_zeros(())

    @staticmethod
    def backward(ctx, _link_grad: torch.Tensor):
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=_link_grad.device)
        dist.recv(grad, src=ctx.target)
        return grad, None


class _BroadcastFromLast(torch.autograd.Function):
    """On the last stage: the result sent to the others; its gradient as it is (every
    stage computes the same loss from it, and only this stage's counts)."""

    @staticmethod
    def forward(ctx, result: torch.Tensor, group, source: int) -> torch.Tensor:
        out = result.contiguous().clone()
        dist.broadcast(out, src=source, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


class _ReceiveFromLast(torch.autograd.Function):
    """On another stage: the last stage's result; a zero gradient for the link, whose
    backward then receives the real one from the next stage."""

    @staticmethod
    def forward(ctx, link: torch.Tensor, shape, dtype, group, source: int) -> torch.Tensor:
        out = torch.empty(shape, dtype=dtype, device=link.device)
        dist.broadcast(out, src=source, group=group)
        return out

    @staticmethod
    def backward(ctx, _grad: torch.Tensor):
        return torch.zeros((), device=_grad.device), None, None, None, None
