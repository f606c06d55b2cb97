"""One forward, one backward (1F1B): a training step's micro-batches through pipeline
stages that work at the same time.

With one micro-batch in flight, a pipeline of P stages keeps each stage busy 1/P of the
time. Here stage s runs P - s - 1 forwards ahead (the warm-up), then alternates one
forward with one backward, then finishes the backwards left (the cool-down): the stages
overlap on different micro-batches, each keeps at most P micro-batches' activations, and
the bubble is P - 1 of M + P - 1 slots for M micro-batches. It is megatron-core's
non-interleaved schedule; megatron's own implementation allocates its receive buffers on
``torch.cuda.current_device()`` and cannot run on CPU, so this one moves activations with
``torch.distributed`` point-to-point operations on the tensors' device (gloo or NCCL).

Each exchange with a neighbour is one batch of operations that both sides post together
(a send paired with the receive the peer posts at the same point), as megatron pairs
them, so neither side waits on a send the other has not matched.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch
import torch.distributed as dist

from .stage_links import Stages

__all__ = ["one_forward_one_backward"]

# forward(micro-batch, input from the previous stage or None on the first) -> the loss (a
# scalar) on the last stage, the activations to send on elsewhere.
Forward = Callable[[int, torch.Tensor | None], torch.Tensor]


def one_forward_one_backward(
    stages: Stages,
    count: int,
    shape_of: Callable[[int], tuple[int, ...]],
    forward: Forward,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Forward and backward of ``count`` micro-batches on this stage, in 1F1B order.
    ``shape_of(m)`` is the shape of micro-batch m's activations between stages; every
    rank of the pipeline calls this with the same micro-batches."""
    link = _Link(stages, dtype, device)
    warmup = min(stages.count - stages.stage - 1, count)
    inputs: deque[torch.Tensor | None] = deque()
    outputs: deque[torch.Tensor] = deque()

    def step_forward(m: int, received: torch.Tensor | None) -> torch.Tensor:
        out = forward(m, received)
        inputs.append(received)
        outputs.append(out)
        return out

    def step_backward(grad: torch.Tensor | None) -> torch.Tensor | None:
        received, out = inputs.popleft(), outputs.popleft()
        if stages.last:
            out.backward()  # the micro-batch's loss
        else:
            assert grad is not None
            torch.autograd.backward(out, grad.to(out.dtype))
        return None if received is None else received.grad

    for m in range(warmup):
        step_forward(m, link.exchange(receive_forward=shape_of(m)))
        link.exchange(send_forward=outputs[-1])
    received = link.exchange(receive_forward=shape_of(warmup)) if warmup < count else None
    steady = count - warmup
    for i in range(steady):
        out = step_forward(warmup + i, received)
        grad = link.exchange(send_forward=out, receive_backward=shape_of(i))
        input_grad = step_backward(grad)
        if i == steady - 1:
            received = None
            link.exchange(send_backward=input_grad)
        else:
            following = shape_of(warmup + i + 1)
            received = link.exchange(send_backward=input_grad, receive_forward=following)
    for m in range(steady, count):
        grad = link.exchange(receive_backward=shape_of(m))
        link.exchange(send_backward=step_backward(grad))


class _Link:
    """This stage's exchanges with its neighbours: what the first stage would receive
    and the last would send forward is nothing."""

    def __init__(self, stages: Stages, dtype: torch.dtype, device: torch.device) -> None:
        self.stages = stages
        self.dtype = dtype
        self.device = device

    def exchange(
        self,
        send_forward: torch.Tensor | None = None,
        send_backward: torch.Tensor | None = None,
        receive_forward: tuple[int, ...] | None = None,
        receive_backward: tuple[int, ...] | None = None,
    ) -> torch.Tensor | None:
        """Post the sends and the receive as one batch and wait for all of them; the
        tensor received (an input asks for its gradient), if any."""
        stages, ops, received = self.stages, [], None
        if receive_forward is not None and not stages.first:
            received = torch.empty(receive_forward, dtype=self.dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, received, stages.previous))
        if receive_backward is not None and not stages.last:
            received = torch.empty(receive_backward, dtype=self.dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, received, stages.following))
        if send_forward is not None and not stages.last:
            ops.append(dist.P2POp(dist.isend, _sent(send_forward, self.dtype), stages.following))
        if send_backward is not None and not stages.first:
            ops.append(dist.P2POp(dist.isend, _sent(send_backward, self.dtype), stages.previous))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        if received is not None and receive_forward is not None:
            received.requires_grad_()
        return received


def _sent(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.detach().to(dtype).contiguous()
