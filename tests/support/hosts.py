"""Hosts on this machine, for tests and benches: each as separate from the others as a
machine of a cluster, joined to them by a network the test can cut, slow and count.

A host is

- a network namespace with ``lo`` and an ``eth0`` on a switch (one Linux bridge) that
  only the hosts are on, at ``10.77.0.<i>/24`` by default, with a MAC address of its own
  that survives a restart (so peers need no new ARP resolution after one);
- a UTS namespace with its own hostname (``h1``, ``h2``...); ``/etc/hosts`` names every
  host, as a cluster's DNS would;
- a mount namespace where ``/dev/shm``, ``/tmp`` and ``/run`` are fresh tmpfs mounts of
  its own, and ``/proc/sys/kernel/random/boot_id`` is a new one at each start, so
  ``asyncrl.transport.host.host_identity()`` differs between hosts and across a restart
  of one, as a reboot's would (containers, below, keep the machine's). The caller's
  shared directories (the cluster's shared filesystem: a run directory, say a pytest
  ``tmp_path``, under ``/tmp`` or not) are seen on every host at the same path. The rest
  of the file system (the code, the virtual environment: brought back too where they
  live under ``/tmp``) is shared too, as software on a cluster's shared filesystem is;
- a PID namespace (whose init is the host's holder process, below) and an IPC namespace,
  so a process sees and can signal only its own host's processes, and killing the init
  kills every process on the host at once, as the kernel does for a PID namespace whose
  init dies: the closest thing to pulling a machine's power.

With ``kind="containers"`` the hosts are containers on one machine instead, as pods of a
Kubernetes node or Docker, Apptainer or enroot containers are: they share its kernel, so
its boot id, and its IPC namespace (Docker's ``--ipc=host``, Kubernetes' ``hostIPC``,
Apptainer and enroot by default), and have the rest of their own. The kernel's own
marks of a machine (the boot id, the IPC namespace) then say the hosts are one.

Nothing passes between hosts but the network: shared memory, sockets in ``/tmp`` or
``/run``, System V IPC (but between containers) and signals stay within one. The switch
is a network namespace of its own, not the caller's, so neither the machine's firewall
(``br_netfilter`` passes bridged frames through the caller's iptables, which Docker sets
to drop forwarded ones) nor its routes see the hosts' traffic, and the test process
itself is not on the hosts' network: it reaches them only by running something on one
(``Hosts.start``/``run``).

Making hosts needs root (network and mount namespaces); ``why_no_hosts()`` says why they
cannot be made where they cannot, so tests skip with that reason::

    pytestmark = pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts()))

    with Hosts(3, shared=[tmp_path]) as hosts:
        server = hosts.start("h1", [sys.executable, "-m", "http.server", "-b", hosts.address("h1")])
        hosts.run("h2", ["curl", f"http://{hosts.address('h1')}:8000/"])
        hosts.limit_rate("h2", "10mbit")    # the host's link, both ways
        hosts.cut_link("h3")                # silence both ways, as a failed switch port
        hosts.kill_host("h1")               # every process dead, its /dev/shm and /tmp gone
        hosts.start_host("h1")              # booted again: same name, address and MAC

Everything is torn down when the ``with`` ends, however it ends. If the test process is
killed outright, its hosts' processes die with it (a parent-death signal on each, and a
host whose init dies loses every process), and the namespaces it left (named
``asyncrl-hosts-<pid>-...``) are removed by the next ``Hosts`` made on this machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import json
import math
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import IO, Literal, NamedTuple

__all__ = [
    "Host",
    "HostDown",
    "HostProcess",
    "Hosts",
    "Traffic",
    "hosts_available",
    "tbf_burst",
    "why_no_hosts",
]

PREFIX = "asyncrl-hosts-"
"""Every network namespace made here is named ``<PREFIX><owner pid>-<n>-<host or sw>``."""

TOOLS = ("ip", "tc", "unshare", "nsenter", "setpriv")
BRIDGE = "br0"  # in the switch's namespace: no name a host or the machine could clash with
PRIVATE = ("/dev/shm", "/tmp", "/run")  # each host's own tmpfs mounts
# What every host runs: this repository and the Python environment. A clean checkout (a
# CI's, say) may live under /tmp, which each host hides behind its own tmpfs.
SOFTWARE = (Path(__file__).resolve().parents[2], Path(sys.prefix).resolve())


def _with_software(shared: list[Path]) -> list[Path]:
    """``shared``, and the software where a private mount would hide it; outermost
    directories only, so that none is bound over one already bound."""
    hidden = [p for p in SOFTWARE if any(p.is_relative_to(root) for root in PRIVATE)]
    wanted = sorted(set(shared + hidden), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in wanted:
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return kept


_instances = count()

HostKind = Literal["machines", "containers"]
HOST_KINDS: tuple[HostKind, ...] = ("machines", "containers")
"""Machines: each host with a boot id of its own (new at each start) and an IPC namespace
of its own. Containers: every host with the machine's boot id and IPC namespace."""


class HostDown(RuntimeError):
    """The host was killed and not started again (``Hosts.start_host``)."""


class Traffic(NamedTuple):
    """Bytes a host's ``eth0`` sent and received since the host (re)started, Ethernet
    headers included (what crossed the wire, as a switch port counts it)."""

    sent: int
    received: int


@dataclass(frozen=True)
class Host:
    name: str  # also its hostname
    address: str  # on the hosts' network, e.g. 10.77.0.1
    mac: str  # 02:00 and the address's four bytes: the same after a restart
    netns: str  # the network namespace's name, for ``ip -n`` / ``ip netns exec``
    port: str  # its port on the switch, in the switch's namespace


@dataclass
class HostProcess:
    """A process started on a host. ``pid`` is its pid as the test's PID namespace sees
    it (so ``os.kill(p.pid, ...)`` from the test reaches it); inside the host it has
    another. It is waited for through the ``nsenter`` that started it, which exits the
    way the process did (``returncode`` -9 after a ``kill -9``)."""

    host: str
    pid: int
    popen: subprocess.Popen[bytes]

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode


@dataclass
class _Running:
    """What a host that is up has: its holder (the PID namespace's init) and processes."""

    holder: subprocess.Popen[bytes]  # the ``unshare`` above the init, in our PID namespace
    init: int  # the init's pid in ours: the target of ``nsenter -t``
    processes: list[HostProcess] = field(default_factory=list)
    limited: bool = False


class Hosts:
    """``count`` hosts named ``h1``..``h<count>`` on one switch, at ``subnet``'s first
    addresses; ``shared`` directories are seen by every host at their own paths.
    ``kind``: ``"machines"`` (a boot id and IPC namespace of each host's own) or
    ``"containers"`` (the machine's, as containers on its kernel have).

    Use it as a context manager (or call ``open`` and ``close``). Methods take a host's
    name. A killed host stays down, off the network, until ``start_host``."""

    def __init__(
        self,
        count: int,
        shared: Iterable[Path | str] = (),
        *,
        subnet: str = "10.77.0.0/24",
        names: Sequence[str] | None = None,
        kind: HostKind = "machines",
    ) -> None:
        if kind not in HOST_KINDS:
            raise ValueError(f"kind={kind!r}: expected one of {', '.join(HOST_KINDS)}")
        self.kind = kind
        names = list(names) if names is not None else [f"h{i}" for i in range(1, count + 1)]
        if len(names) != count or len(set(names)) != count:
            raise ValueError(f"{count} hosts need {count} distinct names, got {names}")
        network = ipaddress.ip_network(subnet)
        if network.num_addresses - 2 < count:
            raise ValueError(f"{subnet} has no room for {count} hosts")
        self.shared = _with_software([Path(path).resolve() for path in shared])
        self.prefix = f"{PREFIX}{os.getpid()}-{next(_instances)}-"
        self.switch = f"{self.prefix}sw"
        self.prefixlen = network.prefixlen
        self.hosts: dict[str, Host] = {}
        for name, address in zip(names, network.hosts(), strict=False):
            mac = "02:00:" + ":".join(f"{byte:02x}" for byte in address.packed)
            netns = f"{self.prefix}{name}"
            self.hosts[name] = Host(name, str(address), mac, netns, port=name)
        self._up: dict[str, _Running] = {}

    # --- the whole ---------------------------------------------------------------------

    def __enter__(self) -> Hosts:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Make the switch and start every host (leftovers of dead owners removed first)."""
        reason = why_no_hosts()
        if reason is not None:
            raise RuntimeError(f"hosts cannot be made here: {reason}")
        sweep_stale()
        try:
            _ip("netns", "add", self.switch)
            # No IPv6 on the hosts' network: its router solicitations and listener reports
            # would be counted as the hosts' traffic, and nothing here speaks IPv6.
            _sysctl(self.switch, "net/ipv6/conf/default/disable_ipv6", "1")
            # Bridged frames may go through iptables (br_netfilter), but the switch's own
            # namespace's, which are empty and accept; off here where the kernel keeps it
            # per namespace, only to save that work.
            _sysctl(self.switch, "net/bridge/bridge-nf-call-iptables", "0", required=False)
            _ip(
                "-n", self.switch, "link", "add", "name", BRIDGE, "type", "bridge", "stp_state", "0"
            )
            _ip("-n", self.switch, "link", "set", BRIDGE, "up")
            for name in self.hosts:
                self.start_host(name)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Kill every host and remove every namespace this made. Safe to call twice."""
        for name in list(self._up):
            with contextlib.suppress(Exception):
                self.kill_host(name)
        for netns in [*(host.netns for host in self.hosts.values()), self.switch]:
            _remove_netns(netns)

    def names(self) -> list[str]:
        return list(self.hosts)

    def address(self, name: str) -> str:
        return self.hosts[name].address

    def is_up(self, name: str) -> bool:
        return name in self._up

    # --- one host's life -----------------------------------------------------------------

    def start_host(self, name: str) -> None:
        """Start host ``name`` (made by ``open``, or killed since): its namespaces, its
        link on the switch (not cut, not limited), fresh tmpfs mounts and a new boot id
        (but the machine's for containers)."""
        host = self.hosts[name]
        if name in self._up:
            raise RuntimeError(f"{name} is up already")
        _remove_netns(host.netns)  # a leftover of a start that failed half-way
        _ip("netns", "add", host.netns)
        _sysctl(host.netns, "net/ipv6/conf/default/disable_ipv6", "1")
        _ip(
            "-n", self.switch, "link", "add", "name", host.port, "type", "veth",
            "peer", "name", "eth0", "address", host.mac, "netns", host.netns,
        )  # fmt: skip
        _ip("-n", self.switch, "link", "set", host.port, "master", BRIDGE, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/{self.prefixlen}", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        self._up[name] = self._start_holder(host)

    def kill_host(self, name: str) -> None:
        """Host ``name`` dies at once, as at a power loss: it is off the network first
        (peers hear nothing more from it, as from a dead machine: no refusal, no reset),
        then every process on it gets SIGKILL in the same instant, and its /dev/shm, /tmp
        and /run go with its mount namespace. It stays down until ``start_host``."""
        running = self._up.pop(name)
        host = self.hosts[name]
        _ip("-n", self.switch, "link", "del", host.port)  # takes eth0, its pair, with it
        with contextlib.suppress(ProcessLookupError):
            os.kill(running.init, signal.SIGKILL)  # the kernel kills the rest of its PIDs
        _kill_all_in(host.netns)  # what joined the host but not its PID namespace (nsenter)
        for popen in [running.holder, *(p.popen for p in running.processes)]:
            popen.wait(10)
        _remove_netns(host.netns)

    # --- processes -----------------------------------------------------------------------

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        cwd: Path | str | None = None,
        stdin: int | None = subprocess.DEVNULL,
    ) -> HostProcess:
        """Start ``argv`` on host ``name`` in ``cwd`` (default: this process's), with this
        process's environment updated by ``env``; stdout and stderr appended to ``log``
        (default: this process's). It dies when the host does, and with this process."""
        if log is None:
            return self._spawn(name, argv, env, cwd, stdin, None, None)
        with log.open("ab") as out:
            return self._spawn(name, argv, env, cwd, stdin, out, subprocess.STDOUT)

    def run(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        timeout: float = 60,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on host ``name`` to its end; its output as text (killed and
        ``TimeoutExpired`` raised after ``timeout``; ``CalledProcessError`` on a non-zero
        exit if ``check``)."""
        proc = self._spawn(
            name, argv, env, cwd, subprocess.DEVNULL, subprocess.PIPE, subprocess.PIPE
        )
        try:
            out, err = proc.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.popen.communicate()
            raise
        done = subprocess.CompletedProcess(
            list(argv), proc.popen.returncode, out.decode(), err.decode()
        )
        if check:
            done.check_returncode()
        return done

    def pid_on_host(self, name: str, host_pid: int) -> int:
        """The pid in this process's PID namespace of the process host ``name`` calls
        ``host_pid`` (as its own logs name it), to signal it from the test."""
        init = self._running(name).init
        target = os.readlink(f"/proc/{init}/ns/pid")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "ns" / "pid") != target:
                    continue
                status = (entry / "status").read_text()
            except OSError:
                continue
            nspids = next(
                line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")
            )
            if int(nspids[-1]) == host_pid:
                return int(entry.name)
        raise ProcessLookupError(f"no process {host_pid} on {name}")

    # --- its link ------------------------------------------------------------------------

    def cut_link(self, name: str) -> None:
        """Host ``name``'s port leaves the switch: from then on nothing it sends arrives
        and nothing reaches it, with no error on either side (its link stays up, as when
        a switch or a cable further on fails); connections time out or stall."""
        self._running(name)
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "nomaster")

    def restore_link(self, name: str) -> None:
        """Host ``name``'s port is on the switch again (forwarding at once: no STP)."""
        self._running(name)
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "master", BRIDGE)

    def limit_rate(
        self,
        name: str,
        rate: str,
        *,
        burst: str | None = None,
        latency: str = "200ms",
        direction: Literal["both", "out", "in"] = "both",
    ) -> None:
        """Limit host ``name``'s link to ``rate`` (tc units: ``1mbit``, ``100mbit``,
        ``1gbit``) with a token bucket (``tc qdisc ... tbf``): what it sends (``out``,
        queued at its ``eth0``), receives (``in``, queued at its switch port) or both.
        ``burst`` is the bucket's size (tc units; default: :func:`tbf_burst`, which
        follows the rate), ``latency`` how long a packet may wait in the queue before it
        is dropped. Replaces an earlier limit."""
        self._running(name).limited = True
        burst = burst or f"{tbf_burst(rate)}b"
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        for netns, dev in self._sides(name, direction):
            _run(["tc", "-n", netns, "qdisc", "replace", "dev", dev, *tbf])

    def clear_limit(self, name: str) -> None:
        """Host ``name``'s link runs at full speed again, both ways."""
        running = self._running(name)
        if running.limited:
            for netns, dev in self._sides(name, "both"):
                # Deleting the default qdisc is an error ("handle of zero"): nothing to undo.
                subprocess.run(
                    ["tc", "-n", netns, "qdisc", "del", "dev", dev, "root"],
                    capture_output=True,
                    check=False,
                )
            running.limited = False

    def counters(self, name: str) -> Traffic:
        """Bytes host ``name`` sent and received on its link since it (re)started."""
        init = self._running(name).init
        for line in Path(f"/proc/{init}/net/dev").read_text().splitlines():
            interface, _, values = line.partition(":")
            if interface.strip() == "eth0":
                fields = values.split()
                return Traffic(sent=int(fields[8]), received=int(fields[0]))
        raise RuntimeError(f"{name} has no eth0")

    # --- inside --------------------------------------------------------------------------

    def _running(self, name: str) -> _Running:
        if name not in self.hosts:
            raise KeyError(f"no host {name!r}: the hosts are {', '.join(self.hosts)}")
        if name not in self._up:
            raise HostDown(f"{name} is down (killed; start_host brings it back)")
        return self._up[name]

    @property
    def _own_ipc(self) -> list[str]:
        return ["--ipc"] if self.kind == "machines" else []

    def _sides(self, name: str, direction: str) -> list[tuple[str, str]]:
        host = self.hosts[name]
        sides = {"out": [(host.netns, "eth0")], "in": [(self.switch, host.port)]}
        return sides[direction] if direction in sides else sides["out"] + sides["in"]

    def _start_holder(self, host: Host) -> _Running:
        etc_hosts = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
            f"{other.address} {other.name}\n" for other in self.hosts.values()
        )
        argv = [
            *_PDEATHSIG, "ip", "netns", "exec", host.netns,
            # The unshare stays in our PID namespace; the init it forks is pid 1 of the
            # host's and dies with it (--kill-child), which dies with us (setpriv).
            "unshare", "--mount", "--uts", *self._own_ipc, "--pid", "--fork", "--kill-child",
            "--mount-proc", "--propagation", "private", "--",
            sys.executable, __file__, "hold", host.name, self.kind, etc_hosts,
            *(str(path) for path in self.shared),
        ]  # fmt: skip
        holder = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert holder.stdout is not None and holder.stderr is not None
        if _read_line(holder.stdout, 30) != b"ready\n":
            holder.kill()
            _, err = holder.communicate()
            raise RuntimeError(f"host {host.name} did not start: {err.decode(errors='replace')}")
        holder.stdout.close()
        holder.stderr.close()
        return _Running(holder, init=_only_child(holder.pid))

    def _spawn(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: Path | str | None,
        stdin: int | None,
        stdout: IO[bytes] | int | None,
        stderr: int | None,
    ) -> HostProcess:
        running = self._running(name)
        # nsenter's own --wd would resolve the directory in our mount namespace, not the
        # host's, so the shell changes to it once inside, then becomes the process.
        enter = ["nsenter", "-t", str(running.init), "--net", "--mount", "--uts", "--pid"]
        enter += self._own_ipc
        shell = ["sh", "-c", 'cd -- "$0" && exec "$@"', str(cwd or os.getcwd())]
        popen = subprocess.Popen(
            [*_PDEATHSIG, *enter, "--", *shell, *argv],
            env={**os.environ, **(env or {})},
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
        )
        # nsenter forks the process into the host's PID namespace and waits for it.
        process = HostProcess(name, _only_child(popen.pid, popen), popen)
        running.processes = [p for p in running.processes if p.poll() is None] + [process]
        return process


# --- the token bucket of a limited link ----------------------------------------------


_MIN_BURST = 32 * 1024  # tc's "32kb": plenty for a slow link
# tc's rate prefixes: decimal, and binary with an "i" (kibit, mibps...)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SCALE.update({"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40})


def tbf_burst(rate: str) -> int:
    """The bucket ``Hosts.limit_rate`` gives tbf for ``rate`` (tc units), in bytes: what
    the link carries in 10 ms, or 32 KiB if that is more.

    tbf refills its bucket once a kernel tick, so a bucket under rate/HZ bytes holds the
    link below ``rate``: 32 KiB at HZ 1000 caps it near 260 mbit/s, whatever the rate
    says. 10 ms covers HZ 100 and up (HZ is 100 to 1000, and not known from here).
    """
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmgt]i?)?(bit|bps)?", rate.strip().lower())
    if match is None:
        raise ValueError(f"rate {rate!r}: expected tc's units (8000, 4mbit, 1gbit, 10mbps)")
    number, prefix, unit = match.groups()
    bits_per_s = float(number) * _SCALE[prefix or ""] * (8 if unit == "bps" else 1)
    return max(_MIN_BURST, math.ceil(bits_per_s / 8 / 100))


# --- whether hosts can be made here ----------------------------------------------------


@functools.cache
def why_no_hosts() -> str | None:
    """Why hosts cannot be made on this machine (None: they can), found by trying."""
    if sys.platform != "linux":
        return f"hosts need Linux namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return "hosts need root (network and mount namespaces)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"hosts need {', '.join(missing)} (iproute2, util-linux) on PATH"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "name", BRIDGE, "type", "bridge")
        _ip("-n", probe, "link", "add", "name", "a", "type", "veth", "peer", "name", "b")
        _in_netns(
            probe,
            "unshare",
            "--mount",
            "--uts",
            "--ipc",
            "--pid",
            "--fork",
            "--mount-proc",
            "--propagation",
            "private",
            "--",
            "true",
        )
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", None) or str(error)
        return f"namespaces, bridges or veths are not permitted here: {detail.strip()}"
    finally:
        _remove_netns(probe)
    return None


def hosts_available() -> bool:
    return why_no_hosts() is None


def sweep_stale() -> None:
    """Remove the namespaces (and what still runs in them) of owners no longer alive."""
    # Here, not at the top: a host's init runs this file too and needs none of asyncrl.
    from asyncrl.transport.host import process_alive

    listed = _run(["ip", "-j", "netns", "list"]).stdout.strip()
    for entry in json.loads(listed or "[]"):
        netns = entry["name"]
        owner = netns.removeprefix(PREFIX).split("-")[0]
        if netns.startswith(PREFIX) and owner.isdigit() and not process_alive(int(owner)):
            _remove_netns(netns)


# --- the holder: each host's init ------------------------------------------------------


def _hold(name: str, kind: str, etc_hosts: str, shared: list[str]) -> None:
    """Run as pid 1 of a host's new namespaces: name the host, give it its own tmpfs
    mounts, /etc/hosts and (unless it is a container) boot id, bring the
    shared directories back into view, say ``ready``, then reap orphans (an init's duty)
    until killed."""
    libc = ctypes.CDLL(None, use_errno=True)
    ms_bind, ms_rec = 4096, 16384

    def mount(source: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
        if (
            libc.mount(
                source.encode(),
                target.encode(),
                fstype and fstype.encode(),
                flags,
                data.encode() or None,
            )
            != 0
        ):
            error = ctypes.get_errno()
            raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")

    socket.sethostname(name)
    # Opened before the tmpfs mounts hide them: each is bound back from its descriptor,
    # the very directory of the machine's file system, wherever it was.
    kept = {path: os.open(path, os.O_RDONLY | os.O_DIRECTORY) for path in shared}
    for path in PRIVATE:
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", 0, "mode=1777")
    for path, fd in kept.items():
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, ms_bind | ms_rec)
        os.close(fd)
    os.makedirs(f"/run/user/{os.getuid()}", mode=0o700)
    Path("/run/hosts").write_text(etc_hosts)
    mount("/run/hosts", "/etc/hosts", None, ms_bind)
    if kind != "containers":
        Path("/run/boot_id").write_text(f"{uuid.uuid4()}\n")
        mount("/run/boot_id", "/proc/sys/kernel/random/boot_id", None, ms_bind)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # so that sigwait sees it
    print("ready", flush=True)
    while True:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        signal.sigwait({signal.SIGCHLD})


# --- plumbing ---------------------------------------------------------------------------

_PDEATHSIG = ["setpriv", "--pdeathsig", "KILL", "--"]  # dies with the thread that started it


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True)


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _in_netns(netns: str, *argv: str) -> None:
    _run(["ip", "netns", "exec", netns, *argv])


def _sysctl(netns: str, key: str, value: str, required: bool = True) -> None:
    """Set /proc/sys/``key`` as network namespace ``netns`` sees it."""
    write = f"echo {value} > /proc/sys/{key}" + ("" if required else " 2>/dev/null || true")
    _in_netns(netns, "sh", "-c", write)


def _read_line(stream: IO[bytes], timeout: float) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else b""


def _only_child(pid: int, popen: subprocess.Popen[bytes] | None = None) -> int:
    """The one child of process ``pid`` (``pid`` itself if it ended without one)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            found = children.read_text().split()
            if found:
                return int(found[0])
        if popen is not None and popen.poll() is not None:
            return pid
        time.sleep(0.002)
    raise RuntimeError(f"process {pid} started no child")


def _members(netns: str) -> Iterator[int]:
    """Pids of the processes in network namespace ``netns``."""
    try:
        target = os.stat(f"/run/netns/{netns}")
    except FileNotFoundError:
        return
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found = os.stat(entry / "ns" / "net")
            except OSError:
                continue
            if (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
                yield int(entry.name)


def _kill_all_in(netns: str) -> None:
    """SIGKILL every process in ``netns``, again until none is left (one may fork)."""
    deadline = time.monotonic() + 10
    while pids := list(_members(netns)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {netns} would not die")
        time.sleep(0.01)


def _remove_netns(netns: str) -> None:
    if os.path.exists(f"/run/netns/{netns}"):
        _kill_all_in(netns)
        _ip("netns", "del", netns)


if __name__ == "__main__" and sys.argv[1:2] == ["hold"]:
    _hold(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
