"""A group rank's process ends cleanly right after a collective, while one of gloo's worker
threads still holds that collective's tensors (as it may behind a sharded model, whose
process group outlives ``destroy_process_group``).

The rank below leaves its last collective's tensors to gloo's worker thread and then ends.
An exit handler holds the GIL for a moment, as a large process's teardown does, so the
worker thread asks for the GIL and waits. If the interpreter then starts finalizing, Python
ends the waiting thread through torch's C++ frames and the process aborts. Ending with
``end_process`` skips that teardown.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.support.ranks import free_port

pytestmark = pytest.mark.timeout(120)

_RANK = """
import atexit, sys, torch
import torch.distributed as dist
from asyncrl.actors.gang import Gang, GangPlace, end_process

gang = Gang(GangPlace(0, 1, "127.0.0.1", {port}), timeout_s=60)
atexit.register(lambda: sum(range(10**8)))  # holds the GIL while the process ends
dist.all_gather_into_tensor(torch.empty(1 << 16), torch.ones(1 << 16), async_op=True)
print("the rank's work is written")
{end}
"""


def _rank(end: str) -> subprocess.CompletedProcess:
    code = _RANK.format(port=free_port(), end=end)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, check=False
    )


def test_a_rank_that_ends_right_after_a_collective_exits_cleanly_and_says_everything() -> None:
    # The same rank ending as Python ends a program aborts: the race is provoked here.
    plain = _rank("sys.exit(0)")
    assert plain.returncode == -signal.SIGABRT, (
        "torch no longer aborts here; end_process may no longer be needed",
        plain.returncode,
        plain.stderr[-2000:],
    )
    assert "terminate called without an active exception" in plain.stderr

    ended = _rank("end_process(0)")
    assert ended.returncode == 0, ended.stderr[-2000:]
    assert ended.stdout.strip().endswith("the rank's work is written")  # flushed first


def test_end_process_gives_the_exit_status() -> None:
    ended = _rank("end_process(3)")
    assert ended.returncode == 3, ended.stderr[-2000:]
    assert "the rank's work is written" in ended.stdout
