"""A scheduler busy-polls only while requests come: once they stop, it sleeps."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from asyncrl.transport import protocol as p
from tests.support.cluster import Cluster
from tests.support.runlink import run_link

pytestmark = pytest.mark.timeout(60)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_an_idle_scheduler_sleeps_after_busy_polling(tmp_path: Path) -> None:
    # A long spin makes the difference plain: were it to go on while idle, the scheduler
    # would burn a whole core.
    c = Cluster(tmp_path, scheduler={"busy_poll_us": 200_000})
    try:
        pid = c.scheduler()
        with run_link(c.run_dir, "observer") as link:
            for _ in range(50):
                assert isinstance(link.request(p.Status(), 5), p.StatusReply)
            time.sleep(0.3)  # the last spin ends
            before = cpu_seconds(pid)
            time.sleep(1.5)
            idle = cpu_seconds(pid) - before
        assert idle < 0.5, f"the idle scheduler used {idle:.2f} s of CPU in 1.5 s"
    finally:
        c.stop_all()
