"""A group of ranks for a test: real processes on this host, spawned, each given its rank,
a free rendezvous port and a queue for what it reports, and ending the way a rank of a run
ends (``end_process``), so that a test sees what a run would."""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import socket
import traceback
from collections.abc import Callable
from typing import Any

from asyncrl.actors.training.gang import end_process

GROUP_SECRET = bytes(range(32))  # the run secret a test's group of ranks meets with


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
    out = multiprocessing.get_context("spawn").Queue()
    processes = start_ranks(target, ranks, free_port(), *args, out)
    got = [out.get(timeout=timeout) for _ in range(results)]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0, f"a rank exited with {process.exitcode}"
    return got


def start_ranks(part: Callable[..., None], ranks: int, *args: Any) -> list[Any]:
    """``ranks`` spawned processes, started, each running ``part(rank, *args)`` (see
    :func:`run_rank`)."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=run_rank, args=(part, r, *args)) for r in range(ranks)]
    for process in processes:
        process.start()
    return processes


def run_rank(part: Callable[..., None], *args: Any) -> None:
    """A rank's process target: ``part(*args)``; then what it put on a queue among ``args``
    goes down the pipe, and the process ends with 0, or 1 after a traceback."""
    code = 0
    try:
        part(*args)
    except BaseException:
        traceback.print_exc()
        code = 1
    for arg in args:
        if isinstance(arg, multiprocessing.queues.Queue):
            arg.close()
            arg.join_thread()  # the teardown that end_process skips would wait for it
    end_process(code)
