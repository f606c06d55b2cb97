"""A group rank's process ends cleanly while one of gloo's worker threads still holds the
tensors of its last collective (as it may behind a sharded model, whose process group
outlives ``destroy_process_group``).

Rank 0 below leaves a collective's tensors to gloo's worker thread and ends. An exit
handler holds the GIL for a while; rank 1 joins the collective only once that has begun,
so the worker thread finishes it then and waits for the GIL to free the tensors. When it
gets the GIL from a finalizer (a large process's teardown runs many), the interpreter is
finalizing: Python ends the thread through torch's C++ frames and the process aborts.
Ending with ``end_process`` skips that teardown.

The same rank ending with ``sys.exit(0)`` aborted (SIGABRT, "terminate called without an
active exception") every time on an idle machine; under load the race can miss, so no
test asserts it (a test's verdict may not depend on how busy or fast the machine is).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.ranks import free_port

pytestmark = pytest.mark.timeout(120)

_RANK = """
import atexit, sys, time, torch
import torch.distributed as dist
from asyncrl.actors.training.gang import Gang, end_process
from asyncrl.runtime.contract.gangs import GangPlace

rank = {rank}
gang = Gang(GangPlace(rank, 2, "127.0.0.1", {port}), secret=bytes(32), timeout_s=30)
if rank == 1:
    time.sleep(1.0)  # rank 0 is in its exit handler by now
    try:
        dist.all_gather_into_tensor(torch.empty(2), torch.ones(1))
    except Exception:
        pass  # rank 0 may have gone before the collective
    end_process(0)
atexit.register(lambda: sum(range(3 * 10**8)))  # holds the GIL for seconds


class Finalized:  # its finalizer lets go of the GIL while the interpreter finalizes
    def __del__(self, sleep=time.sleep):
        sleep(0.5)


finalized = Finalized()
print("the rank's work is written")  # not flushed: a pipe's buffer holds it
dist.all_gather_into_tensor(torch.empty(2), torch.ones(1), async_op=True)
{end}
"""


def _group(end: str) -> subprocess.CompletedProcess:
    """Rank 0 of a group of two, ending with ``end``; rank 1 helps with the collective."""
    port = free_port()
    code = [_RANK.format(rank=rank, port=port, end=end) for rank in (0, 1)]
    helper = subprocess.Popen([sys.executable, "-c", code[1]], stdout=subprocess.DEVNULL)
    try:
        return subprocess.run(
            [sys.executable, "-c", code[0]], capture_output=True, text=True, timeout=90
        )
    finally:
        helper.wait(timeout=60)


def test_a_rank_that_ends_with_a_collective_in_hand_exits_cleanly_and_says_everything() -> None:
    ended = _group("end_process(0)")
    assert ended.returncode == 0, ended.stderr[-2000:]
    assert ended.stdout.strip().endswith("the rank's work is written")  # flushed first

    ended = _group("end_process(3)")
    assert ended.returncode == 3, ended.stderr[-2000:]
