"""The 1F1B schedule over two real processes (gloo): each stage runs its forwards and
backwards in 1F1B order, the stages exchange activations and their gradients, and the
gradients come out as one process computing everything would have them."""

from __future__ import annotations

import multiprocessing

import pytest
import torch
import torch.distributed as dist

from tests.integration.test_train_group import _first_result
from tests.support.ranks import free_port, start_ranks

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.timeout(120)

MICRO_BATCHES = 4
WIDTH = 3


def _inputs(m: int) -> torch.Tensor:
    return torch.arange(WIDTH, dtype=torch.float32) + m


def _stage_main(rank: int, port: int, results) -> None:
    from asyncrl.actors.engines.megatron.schedule import one_forward_one_backward
    from asyncrl.actors.engines.megatron.stage_links import Stages

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        stages = Stages(rank, 2, dist.group.WORLD, rank - 1, rank + 1, 1)
        weight = torch.full((WIDTH,), 2.0 + rank, requires_grad=True)
        order: list[str] = []

        def forward(m: int, received: torch.Tensor | None) -> torch.Tensor:
            order.append(f"F{m}")
            if rank == 0:  # the first stage: weight * x, on to the next
                out = weight * _inputs(m)
                out.register_hook(lambda grad: order.append(f"B{m}"))
                return out
            assert received is not None
            received.register_hook(lambda grad: order.append(f"B{m}"))
            return ((received * weight) ** 2).sum() * (m + 1)  # the last stage: the loss

        one_forward_one_backward(
            stages, MICRO_BATCHES, lambda m: (WIDTH,), forward, torch.float32, torch.device("cpu")
        )
        results.put((rank, order, weight.grad.tolist()))
    finally:
        dist.destroy_process_group()


def test_two_stages_run_1f1b_and_get_the_gradients_of_one_process() -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = start_ranks(_stage_main, 2, port, results)
    got = dict((rank, rest) for rank, *rest in (_first_result(results, ranks) for _ in ranks))
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    # The first stage runs one forward ahead, then alternates; the last alternates.
    assert got[0][0] == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert got[1][0] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]

    first = torch.full((WIDTH,), 2.0, requires_grad=True)
    last = torch.full((WIDTH,), 3.0, requires_grad=True)
    for m in range(MICRO_BATCHES):
        (((first * _inputs(m)) * last) ** 2).sum().mul(m + 1).backward()
    assert got[0][1] == pytest.approx(first.grad.tolist(), rel=1e-6)
    assert got[1][1] == pytest.approx(last.grad.tolist(), rel=1e-6)
