"""Hosts that are containers on one kernel (tests/support/hosts.py, ``kind="containers"``):
they share the machine's boot id and IPC namespace, and are still separate hosts: each
has its own host identity, and weights between two of them go over the network, since
the shared memory UCX would otherwise choose does not reach from one to the other."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.transport.dataplane.store import PayloadStore
from tests.support.hosts import Hosts, hosts_available, why_no_hosts

pytestmark = pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts()))

WHO = """
from pathlib import Path
from asyncrl.transport.host import host_identity
print(Path("/proc/sys/kernel/random/boot_id").read_text().strip(), host_identity())
"""

# A UCX worker that publishes its address in the shared directory, takes one request
# (the asker's address) and answers it with SIZE bytes.
SERVE = """
import os, sys, time
import numpy as np
from asyncrl.transport.weights.ucx.node import UcxNode, wait
shared, size = sys.argv[1], int(sys.argv[2])
node = UcxNode(local=False)  # hosts apart: their network devices, not loopback
with open(f"{shared}/address.part", "wb") as out:
    out.write(node.address)
os.rename(f"{shared}/address.part", f"{shared}/address")
request = np.zeros(4096, np.uint8)
assert wait(node.recv_any(request, 1), time.monotonic() + 30, "the asker", "a request")
asker = request[4 : 4 + int(request[:4].view(np.uint32)[0])].tobytes()
sent = node.send(asker, np.arange(size, dtype=np.uint64).view(np.uint8)[:size], 2)
assert wait(sent, time.monotonic() + 30, "the asker", "the answer")
time.sleep(1)  # the asker closes first: no reset logged for it
"""

# Asks that worker for its bytes; prints whether they came.
ASK = """
import os, sys, time
import numpy as np
from asyncrl.transport.weights.ucx.node import UcxNode, wait
shared, size = sys.argv[1], int(sys.argv[2])
while not os.path.exists(f"{shared}/address"):
    time.sleep(0.05)
server = open(f"{shared}/address", "rb").read()
node = UcxNode(local=False)  # hosts apart: their network devices, not loopback
mine = np.frombuffer(node.address, np.uint8)
request = np.zeros(4096, np.uint8)
request[:4] = np.array([mine.size], np.uint32).view(np.uint8)
request[4 : 4 + mine.size] = mine
into = np.zeros(size, np.uint8)
answer = node.recv(server, into, 2)
node.send(server, request, 1)
arrived = wait(answer, time.monotonic() + 10, "the server", "the answer")
expected = np.arange(size, dtype=np.uint64).view(np.uint8)[:size]
print("arrived" if arrived and (into == expected).all() else "stalled")
node.close()
"""

SIZE = 8 << 20  # past UCX's eager sizes: the bytes take its rendezvous path


@pytest.fixture
def containers(tmp_path: Path) -> Iterator[Hosts]:
    with Hosts(2, shared=[tmp_path], kind="containers") as made:
        yield made


def python(hosts: Hosts, name: str, code: str, *args: str) -> str:
    return hosts.run(name, [sys.executable, "-c", code, *args], timeout=60).stdout.strip()


def test_containers_sharing_a_boot_id_are_separate_hosts(containers: Hosts) -> None:
    machine = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    seen = {name: python(containers, name, WHO).split() for name in containers.names()}
    assert {boot for boot, _ in seen.values()} == {machine}  # the kernel's, as containers have
    assert seen["h1"][1] != seen["h2"][1]
    # Two processes of one container are on one host.
    assert python(containers, "h1", WHO).split()[1] == seen["h1"][1]


# Each runs WHO in namespaces of its own, apart from the rest of this process's (its host
# name and boot id included): a /dev/shm of its own, or PIDs, or a network.
APART = {
    "/dev/shm": ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                 'mount -t tmpfs tmpfs /dev/shm && exec "$0" "$@"'],
    "pids": ["unshare", "--pid", "--fork", "--mount-proc", "--"],
    "network": ["unshare", "--net", "--"],
}  # fmt: skip


@pytest.mark.parametrize("apart", APART)
def test_namespaces_that_share_a_boot_id_and_name_are_not_one_host(apart: str) -> None:
    def who(*prefix: str) -> list[str]:
        argv = [*prefix, sys.executable, "-c", WHO]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()

    here, there = who(), who(*APART[apart])
    assert here[0] == there[0]  # one kernel, one boot id
    assert here[1].split("/")[0] == there[1].split("/")[0]  # one host name
    assert here[1] != there[1], f"apart by {apart}, yet one host: {here[1]}"
    assert who() == here  # the same namespaces: the same host


def test_a_worker_in_another_container_is_reached_over_the_network(
    containers: Hosts, tmp_path: Path
) -> None:
    server = containers.start("h1", [sys.executable, "-c", SERVE, str(tmp_path), str(SIZE)])
    # UCX alone takes h2 for h1's machine (one boot id, one IPC namespace) and wires the
    # two over System V shared memory, which does not reach: the bytes never came.
    assert python(containers, "h2", ASK, str(tmp_path), str(SIZE)) == "arrived"
    assert server.wait(30) == 0


def test_a_worker_in_the_same_container_is_reached_too(containers: Hosts, tmp_path: Path) -> None:
    server = containers.start("h1", [sys.executable, "-c", SERVE, str(tmp_path), str(SIZE)])
    assert python(containers, "h1", ASK, str(tmp_path), str(SIZE)) == "arrived"
    assert server.wait(30) == 0


# Keeps a payload store in the shared directory, under a pid this process's PID namespace
# has not given (ns_last_pid, set in its own), and says where; then waits.
HOLD = """
import sys, time
from pathlib import Path
from asyncrl.transport.dataplane.store import PayloadStore
store = PayloadStore("generate-0", shared_dir=Path(sys.argv[1]))
store.put_frames([b"kept"])
print(store.directory, flush=True)
time.sleep(60)
"""


def test_a_sweep_leaves_the_stores_of_a_container_that_shares_its_shm(tmp_path: Path) -> None:
    free = next(pid for pid in range(20_000, 30_000) if not Path(f"/proc/{pid}").exists())
    shell = f'echo {free - 1} > /proc/sys/kernel/ns_last_pid; "$0" "$@" & wait'
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--", "sh", "-c", shell,
            sys.executable, "-c", HOLD, str(tmp_path)]  # fmt: skip
    holder = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        held = Path(holder.stdout.readline().strip())
        assert (held / "owner").read_text().split()[0] == str(free)  # dead here, alive there
        PayloadStore("logp-0", shared_dir=tmp_path)  # sweeps the directory as it starts
        assert held.is_dir(), "a live store of another container was swept"
    finally:
        holder.kill()
        holder.wait()
