"""A group of ranks for a test: real processes on this host, spawned, each given its rank,
a free rendezvous port and a queue for what it reports."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(
    target: Callable[..., None], ranks: int, *args: Any, results: int, timeout: float = 150
) -> list[Any]:
    """Run ``target(rank, port, *args, out)`` in ``ranks`` processes; the ``results`` items
    they put on ``out``, in arrival order. Every process must exit 0.

    Results cross the process boundary as numpy arrays or plain values: a queued tensor is
    shared by a handle that dies with the rank that sent it.
    """
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    port = free_port()
    processes = [context.Process(target=target, args=(r, port, *args, out)) for r in range(ranks)]
    for process in processes:
        process.start()
    got = [out.get(timeout=timeout) for _ in range(results)]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0, f"a rank exited with {process.exitcode}"
    return got
