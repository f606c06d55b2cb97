"""A group of ranks meets where only its own ranks reach: a stranger neither reads the
leader's orders nor plants one that a follower carries out.

Two real ranks join through ``join_group_at`` (as ``asyncrl-worker --rank`` does), the
leader gives an order and waits; meanwhile the test, as a stranger without the run secret,
tries the group's store the way torch's own clients speak to it, and the way ours do
with a key of its own. A group on loopback is not on the machine's network address at
all; a group across machines (here: on that address) lets in only the run's key.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import subprocess
from datetime import timedelta
from pathlib import Path

import msgpack
import pytest
import torch.distributed as dist

from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.contract.gangs import GangPlace
from asyncrl.transport.group_store import GroupStoreClient, GroupStoreError
from asyncrl.transport.host import machine_address
from asyncrl.transport.identity import ensure_run_secret
from tests.support.ranks import free_port, start_ranks

pytestmark = pytest.mark.timeout(120)

_ORDER = b"the leader's first order"
_LOOPBACK = "0100007F"  # 127.0.0.1 in /proc/net/tcp
_PLANTED = msgpack.packb(["load", b"a stranger's order"])


def _rank(rank: int, port: int, host: str, gloo: str, run_dir: str, attacked, out) -> None:
    import torch
    import torch.distributed as dist

    from asyncrl.actors.training.gang import Order, join_group_at

    os.environ["GLOO_SOCKET_IFNAME"] = gloo  # gloo's default on a host named by its address
    cfg = config_from_dict({"run": {"dir": run_dir}})
    gang = join_group_at(cfg, GangPlace(rank, 2, host, port))
    dist.all_reduce(torch.ones(1))  # gloo's connections are up
    if rank == 0:
        gang.order(Order.SCORE, _ORDER)
        out.put(("ordered", _listening()))
        assert attacked.wait(60)
        gang.leave()
        return
    taken = []
    while not taken or taken[-1][0] != Order.STOP.value:
        order, body = gang.next_order()
        taken.append((order.value, body))
    out.put(("taken", taken, _listening()))
    gang.close()


def _listening() -> list[str]:
    """The addresses this process listens on, as /proc/net writes them (hex)."""
    sockets = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):
            sockets.add(os.readlink(fd).removeprefix("socket:[").removesuffix("]"))
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path("/proc/self/net", table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in sockets:  # 0A: LISTEN
                found.append(fields[1].rpartition(":")[0])
    return found


def _interface_of(address: str) -> str:
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    for line in shown.stdout.splitlines():
        fields = line.split()
        if fields[3].partition("/")[0] == address:
            return fields[1]
    pytest.skip(f"no interface holds {address}")


def _what_torch_clients_manage(host: str, port: int) -> list[str]:
    """What a client of torch's TCPStore got done at ``host:port``: read an order, plant
    the next."""
    try:
        store = dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=1), wait_for_workers=False
        )
    except (RuntimeError, dist.DistError):
        return []
    done = []
    try:
        store.get("asyncrl/order/0")
        done.append("read")
        store.set("asyncrl/order/1", _PLANTED)
        done.append("wrote")
    except (RuntimeError, dist.DistError):
        pass
    return done


def _what_a_stranger_key_manages(host: str, port: int) -> list[str]:
    """What a client of our store with another run's secret got done."""
    stranger = GroupStoreClient(host, port, secrets.token_bytes(32), timeout_s=3)
    done = []
    try:
        stranger.call("get", ["asyncrl/order/0"], 1.0, waits_s=1.0)
        done.append("read")
        stranger.call("set", "asyncrl/order/1", _PLANTED)
        done.append("wrote")
    except GroupStoreError:
        pass
    finally:
        stranger.close()
    return done


@pytest.mark.parametrize("meets_on", ["loopback", "network"])
def test_a_stranger_neither_reads_nor_plants_the_leaders_orders(
    meets_on: str, tmp_path: Path
) -> None:
    network = machine_address()
    if network == "127.0.0.1" or ":" in network:
        pytest.skip("no IPv4 network address on this machine")
    host = "127.0.0.1" if meets_on == "loopback" else network
    ensure_run_secret(tmp_path / "run.secret")
    context = multiprocessing.get_context("spawn")
    attacked, out = context.Event(), context.Queue()
    port = free_port()
    gloo = _interface_of(network)
    ranks = start_ranks(_rank, 2, port, host, gloo, str(tmp_path), attacked, out)
    try:
        said, leader_listens = out.get(timeout=90)
        assert said == "ordered"
        managed = {
            "torch's client on the network address": _what_torch_clients_manage(network, port),
            "torch's client on loopback": _what_torch_clients_manage("127.0.0.1", port),
            "another run's key": _what_a_stranger_key_manages(host, port),
        }
        assert managed == {way: [] for way in managed}
        attacked.set()
        said, taken, follower_listens = out.get(timeout=60)
    finally:
        attacked.set()
        for rank in ranks:
            rank.join(timeout=30)
            if rank.exitcode is None:  # a follower that took a planted order waits on
                rank.kill()
    assert taken == [("score", _ORDER), ("stop", b"")]  # the leader's orders, and only those
    if meets_on == "loopback":  # the store and gloo: nothing on the network address
        assert set(leader_listens) | set(follower_listens) == {_LOOPBACK}
    assert [rank.exitcode for rank in ranks] == [0, 0]
