"""Hosts on this machine (tests/support/hosts.py): each its own network, name, identity,
shared memory and /tmp, joined only by a network the tests cut, slow and count, and gone
without a trace when the test ends, or when the process that made them is killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import processes_mentioning, wait_for
from tests.support.hosts import PREFIX, HostDown, Hosts, hosts_available, sweep_stale, why_no_hosts

pytestmark = pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts()))

PORT = 7101

# Serves ``size`` bytes to each connection on ``address``:PORT, and says so in ``ready``.
SERVE = f"""
import socket, sys
address, size, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
server = socket.create_server((address, {PORT}))
open(ready, "w").close()
while True:
    conn, _ = server.accept()
    try:
        conn.sendall(bytes(size))
    except OSError:
        pass  # the client left early (a connection check)
    conn.close()
"""

# Fetches everything the server sends; prints the bytes and the seconds the fetch took.
FETCH = f"""
import json, socket, sys, time
conn = socket.create_connection((sys.argv[1], {PORT}), timeout=float(sys.argv[2]))
start, got = time.monotonic(), 0
while chunk := conn.recv(1 << 16):
    got += len(chunk)
print(json.dumps({{"bytes": got, "seconds": time.monotonic() - start}}))
"""

# Tries one connection; prints how it went: "ok", or the error's class name.
CONNECT = f"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], {PORT}), timeout=float(sys.argv[2])).close()
    print("ok")
except OSError as error:
    print(type(error).__name__)
"""


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    with Hosts(3, shared=[tmp_path]) as made:
        yield made


def python(hosts: Hosts, name: str, code: str, *args: str, timeout: float = 30) -> str:
    return hosts.run(name, [sys.executable, "-c", code, *args], timeout=timeout).stdout.strip()


def serve(hosts: Hosts, name: str, tmp_path: Path, size: int = 1 << 20) -> None:
    ready = tmp_path / f"serving-{name}"
    ready.unlink(missing_ok=True)  # a server started before on this host left it behind
    hosts.start(name, [sys.executable, "-c", SERVE, hosts.address(name), str(size), str(ready)])
    wait_for(ready.exists, 10, f"a server on {name}")


def fetch(hosts: Hosts, name: str, server: str) -> dict:
    return json.loads(python(hosts, name, FETCH, hosts.address(server), "20"))


def test_hosts_talk_zeromq_to_each_other_by_address(hosts: Hosts, tmp_path: Path) -> None:
    reply = """
import sys, zmq
rep = zmq.Context().socket(zmq.REP)
rep.bind(f"tcp://{sys.argv[1]}:7102")
rep.send(rep.recv() + b" from " + sys.argv[2].encode())
"""
    request = """
import sys, zmq
req = zmq.Context().socket(zmq.REQ)
req.connect(f"tcp://{sys.argv[1]}:7102")
req.send(b"hello")
assert req.poll(10_000), "no reply"
print(req.recv().decode())
"""
    server = hosts.start("h1", [sys.executable, "-c", reply, hosts.address("h1"), "h1"])
    assert python(hosts, "h2", request, hosts.address("h1")) == "hello from h1"
    assert python(hosts, "h3", CONNECT, "h1", "2") == "ConnectionRefusedError"  # by name too
    assert server.wait(10) == 0


def test_each_host_has_its_own_name_identity_memory_and_tmp(hosts: Hosts, tmp_path: Path) -> None:
    who = "import socket; from asyncrl.transport.host import host_identity as h; print(h())"
    identities = [python(hosts, name, who) for name in hosts.names()]
    assert [i.split("/")[0] for i in identities] == ["h1", "h2", "h3"]
    assert len({i.split("/")[1] for i in identities}) == 3  # boot ids too
    # Two processes on one host share its /dev/shm and /tmp; no other host sees them.
    hosts.run("h1", ["sh", "-c", "echo one > /dev/shm/mine && echo one > /tmp/mine"])
    assert hosts.run("h1", ["cat", "/dev/shm/mine", "/tmp/mine"]).stdout == "one\none\n"
    for name in ("h2", "h3"):
        assert hosts.run(name, ["ls", "-A", "/dev/shm", "/run"]).stdout.split() == [
            "/dev/shm:",
            "/run:",
            "boot_id",
            "hosts",
            "user",
        ]
        assert hosts.run(name, ["test", "-e", "/tmp/mine"], check=False).returncode != 0
    assert not Path("/dev/shm/mine").exists() and not Path("/tmp/mine").exists()
    # The shared directory (under /tmp, here) is the same one everywhere.
    for name in hosts.names():
        hosts.run(name, ["sh", "-c", f"echo {name} > {tmp_path}/from-{name}"])
    for name in hosts.names():
        seen = hosts.run(name, ["sh", "-c", f"cat {tmp_path}/from-*"]).stdout.split()
        assert seen == ["h1", "h2", "h3"]
    # A process sees its own host's processes only, under pids of its own; the test
    # finds one by the pid its host gives it, and the host's init reaps an orphan.
    orphan = int(hosts.run("h1", ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"]).stdout)
    pid = hosts.pid_on_host("h1", orphan)
    assert pid != orphan and Path(f"/proc/{pid}/cmdline").read_text().split("\0") == [
        "sleep",
        "300",
        "",
    ]
    for name in ("h1", "h2"):
        seen = hosts.run(name, ["ls", "/proc"]).stdout.split()
        assert str(pid) not in seen and ("1" in seen)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, "the orphan reaped")


def test_a_killed_host_loses_every_process_and_its_memory(hosts: Hosts, tmp_path: Path) -> None:
    serve(hosts, "h1", tmp_path)
    hosts.run("h1", ["sh", "-c", "echo kept > /dev/shm/staged"])
    sleep = f"sleep 300.{os.getpid()}"  # this test's own: another run may sleep 300 too
    forked = hosts.start("h1", ["sh", "-c", f"{sleep} & {sleep} & wait"])
    who = "from asyncrl.transport.host import host_identity as h; print(h())"
    before = python(hosts, "h1", who)
    assert fetch(hosts, "h2", "h1")["bytes"] == 1 << 20

    hosts.kill_host("h1")
    assert forked.returncode == -signal.SIGKILL
    assert not hosts.is_up("h1")
    assert processes_mentioning(sleep) == []
    with pytest.raises(HostDown):
        hosts.counters("h1")
    # A dead host does not answer: no refusal, no reset, as from a machine without power.
    assert python(hosts, "h2", CONNECT, hosts.address("h1"), "1") in {"timeout", "TimeoutError"}

    hosts.start_host("h1")
    assert hosts.run("h1", ["ls", "-A", "/dev/shm"]).stdout == ""
    after = python(hosts, "h1", who)
    assert after.split("/")[0] == "h1" and after != before  # a new boot
    serve(hosts, "h1", tmp_path)
    assert fetch(hosts, "h2", "h1")["bytes"] == 1 << 20  # at once: the same MAC address


def test_a_cut_link_carries_nothing_until_restored(hosts: Hosts, tmp_path: Path) -> None:
    serve(hosts, "h1", tmp_path)
    assert python(hosts, "h2", CONNECT, hosts.address("h1"), "2") == "ok"
    hosts.cut_link("h1")
    assert python(hosts, "h2", CONNECT, hosts.address("h1"), "1") in {"timeout", "TimeoutError"}
    assert python(hosts, "h1", CONNECT, hosts.address("h1"), "1") == "ok"  # itself, still
    hosts.restore_link("h1")
    assert python(hosts, "h2", CONNECT, hosts.address("h1"), "2") == "ok"


def test_a_limited_link_is_slow_until_cleared(hosts: Hosts, tmp_path: Path) -> None:
    serve(hosts, "h1", tmp_path)  # 1 MiB a fetch: 8.4 Mbit, 2.1 s at 4 Mbit/s
    assert fetch(hosts, "h2", "h1")["seconds"] < 1.0
    hosts.limit_rate("h1", "4mbit", direction="out")  # what h1 sends
    assert fetch(hosts, "h2", "h1")["seconds"] > 1.5
    hosts.clear_limit("h1")
    hosts.limit_rate("h2", "4mbit", direction="in")  # what h2 receives
    assert fetch(hosts, "h2", "h1")["seconds"] > 1.5
    assert fetch(hosts, "h3", "h1")["seconds"] < 1.0  # others' links are not limited
    hosts.clear_limit("h2")
    assert fetch(hosts, "h2", "h1")["seconds"] < 1.0


def test_a_fast_limit_gets_a_bucket_for_its_rate_unless_told_otherwise(hosts: Hosts) -> None:
    def burst() -> int:  # as tc reports it, rounded to its clock: "32Kb", "1250000b"
        shown = hosts.run("h1", ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        found = re.search(r"burst (\d+)(b|Kb|Mb)", shown)
        assert found, shown
        number, unit = found.groups()
        return int(number) * {"b": 1, "Kb": 1024, "Mb": 1024 * 1024}[unit]

    hosts.limit_rate("h1", "1gbit", direction="out")
    assert burst() == 1_250_000  # 10 ms at 1 gbit/s, not 32 kB
    hosts.limit_rate("h1", "4mbit", direction="out")
    assert burst() == 32 * 1024
    hosts.limit_rate("h1", "1gbit", burst="32kb", direction="out")
    assert 32_000 < burst() <= 32 * 1024
    hosts.clear_limit("h1")


def test_counters_count_each_hosts_traffic(hosts: Hosts, tmp_path: Path) -> None:
    serve(hosts, "h1", tmp_path)
    before = {name: hosts.counters(name) for name in hosts.names()}
    assert fetch(hosts, "h2", "h1")["bytes"] == 1 << 20
    after = {name: hosts.counters(name) for name in hosts.names()}
    grew = {
        n: (after[n].sent - before[n].sent, after[n].received - before[n].received)
        for n in hosts.names()
    }
    # 1 MiB of payload and its headers one way, acknowledgements the other; TCP resends
    # segments on a loaded machine (12.6% more than the payload once, in CI on 2026-11-29),
    # so the bound is what tells one host's megabyte from two.
    assert 1 << 20 < grew["h1"][0] < 1.5 * (1 << 20)
    assert 1 << 20 < grew["h2"][1] < 1.5 * (1 << 20)
    assert grew["h1"][1] < 0.05 * (1 << 20) and grew["h2"][0] < 0.05 * (1 << 20)
    assert grew["h3"][0] < 1024 and grew["h3"][1] < 4096  # at most a broadcast or two


def test_hosts_leave_nothing_behind(tmp_path: Path) -> None:
    with Hosts(2, shared=[tmp_path]) as hosts:
        sleeper = hosts.start("h1", ["sleep", "300"])
        prefix = hosts.prefix
    assert sleeper.returncode == -signal.SIGKILL
    assert not [ns for ns in netns_names() if ns.startswith(prefix)]
    assert processes_mentioning(prefix) == []


def test_the_hosts_of_a_killed_owner_die_with_it_and_are_swept(tmp_path: Path) -> None:
    sleep = f"301.{os.getpid()}"  # this test's own: another run may sleep 301 too
    owner = f"""
import sys, time
sys.path.insert(0, {str(Path.cwd())!r})
from tests.support.hosts import Hosts
hosts = Hosts(2).__enter__()
print(hosts.start("h1", ["sleep", {sleep!r}]).pid, hosts.prefix, flush=True)
time.sleep(300)
"""
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pid, prefix = proc.stdout.readline().split()
    assert os.path.exists(f"/proc/{pid}")
    proc.kill()
    proc.wait(10)
    gone = lambda: processes_mentioning(f"sleep {sleep}") == []  # noqa: E731
    wait_for(gone, 10, "the host's processes to die")
    assert {f"{prefix}sw", f"{prefix}h1", f"{prefix}h2"} <= set(netns_names())
    sweep_stale()
    assert not [ns for ns in netns_names() if ns.startswith(prefix)]
    assert not [ns for ns in netns_names() if ns.startswith(f"{PREFIX}{proc.pid}-")]


def netns_names() -> list[str]:
    listed = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True)
    return [entry["name"] for entry in json.loads(listed.stdout.strip() or "[]")]
