"""A group of ranks across two hosts (tests/support/hosts.py), and a third host without
the run secret on the same network: it neither reads the leader's orders nor plants one,
whether it speaks torch's store protocol or ours with a key of its own. The ranks share
only the network and the run directory (where the run secret is), as on a cluster.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from asyncrl.transport.identity import ensure_run_secret
from tests.support.hosts import Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    pytest.mark.timeout(180),
]

PORT = 29400
ORDER = "the leader's first order"

_RANK = """
import json, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from asyncrl.actors.training.gang import Order, end_process, join_group_at
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.contract.gangs import GangPlace

rank, leader, port, shared = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
cfg = config_from_dict({"run": {"dir": str(shared)}})
gang = join_group_at(cfg, GangPlace(rank, 2, leader, port))
dist.all_reduce(torch.ones(1))  # gloo's connections between the hosts are up
if rank == 0:
    gang.order(Order.SCORE, sys.argv[5].encode())
    (shared / "ordered").touch()
    while not (shared / "attacked").exists():
        time.sleep(0.05)
    gang.leave()
else:
    taken = []
    while not taken or taken[-1][0] != "stop":
        order, body = gang.next_order()
        taken.append([order.value, body.decode()])
    (shared / "taken.json").write_text(json.dumps(taken))
    gang.close()
end_process(0)
"""

_STRANGER = """
import json, secrets, sys
from datetime import timedelta
import msgpack
import torch.distributed as dist
from asyncrl.transport.group_store import GroupStoreClient, GroupStoreError

leader, port = sys.argv[1], int(sys.argv[2])
planted = msgpack.packb(["load", b"a stranger's order"])
managed = {"torch's client": [], "another run's key": []}
try:
    store = dist.TCPStore(leader, port, is_master=False, timeout=timedelta(seconds=2))
    store.get("asyncrl/order/0")
    managed["torch's client"].append("read")
    store.set("asyncrl/order/1", planted)
    managed["torch's client"].append("wrote")
except (RuntimeError, dist.DistError):
    pass
stranger = GroupStoreClient(leader, port, secrets.token_bytes(32), timeout_s=3)
try:
    stranger.call("get", ["asyncrl/order/0"], 1.0, waits_s=1.0)
    managed["another run's key"].append("read")
    stranger.call("set", "asyncrl/order/1", planted)
    managed["another run's key"].append("wrote")
except GroupStoreError:
    pass
print(json.dumps(managed))
"""


def _wait_for(path: Path, ranks: list, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        failed = [r.returncode for r in ranks if r.poll() not in (None, 0)]
        assert not failed and time.monotonic() < deadline, f"no {path.name}; ranks: {failed}"
        time.sleep(0.1)


def test_a_host_without_the_run_secret_neither_reads_nor_plants_orders(tmp_path: Path) -> None:
    ensure_run_secret(tmp_path / "run.secret")
    log = tmp_path / "ranks.log"
    with Hosts(3, shared=[tmp_path]) as hosts:
        leader = hosts.address("h1")
        argv = [sys.executable, "-c", _RANK, leader, str(PORT), str(tmp_path), ORDER]
        ranks = [hosts.start(f"h{r + 1}", [*argv[:3], str(r), *argv[3:]], log=log) for r in (0, 1)]
        try:
            _wait_for(tmp_path / "ordered", ranks)
            tried = hosts.run("h3", [sys.executable, "-c", _STRANGER, leader, str(PORT)])
            managed = json.loads(tried.stdout.strip().splitlines()[-1])
            assert managed == {"torch's client": [], "another run's key": []}
            (tmp_path / "attacked").touch()
            _wait_for(tmp_path / "taken.json", ranks)
            codes = [rank.wait(60) for rank in ranks]
        finally:
            (tmp_path / "attacked").touch()
    assert json.loads((tmp_path / "taken.json").read_text()) == [["score", ORDER], ["stop", ""]]
    assert codes == [0, 0], log.read_text()[-3000:]
