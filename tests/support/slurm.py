"""A real Slurm cluster over hosts (tests/support/hosts.py): ``slurmctld`` on a host of
its own, one ``slurmd`` per compute host, ``munged`` on every host, GPUs declared as gres.

Nothing is installed here: the Debian packages ``slurm-wlm`` and ``munge`` (CI installs
them) provide the daemons; ``why_no_slurm()`` says what is missing so tests skip with the
reason. Everything the daemons write (state, spool, logs, pid files) is under the test's
directory, per node (``%n``), and the configuration is found through ``SLURM_CONF``, so
the machine's own /etc/slurm is never read or written.

What makes it run in namespaces: ``proctrack/linuxproc`` and ``task/none`` (no cgroup
confinement of the jobs' processes: a host's /sys, from ``ip netns exec``, has no cgroup
file system) and ``CgroupPlugin=cgroup/v1`` named (its autodetection fails on a machine
with both cgroup versions mounted). A host's /run is its own, so each host runs its own
``munged`` with the cluster's one key, as every machine of a cluster does.

The fake GPUs are character devices ``gpu0``, ``gpu1``... (major 195, as /dev/nvidiaN;
Slurm stats them, nothing opens them): Slurm hands them to jobs by ``--gres=gpu:K`` and
sets ``CUDA_VISIBLE_DEVICES`` from their numbers.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .hosts import HostProcess, Hosts, why_no_hosts

__all__ = ["Slurm", "slurm_available", "why_no_slurm"]

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo")
PARTITION = "main"


@functools.cache
def why_no_slurm() -> str | None:
    """Why a Slurm cluster cannot be made here (None: it can)."""
    missing = [tool for tool in DAEMONS if _which(tool) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing): "
            "apt-get install slurm-wlm munge"
        )
    return why_no_hosts()


def slurm_available() -> bool:
    return why_no_slurm() is None


def _which(tool: str) -> str | None:
    return shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


class Slurm:
    """A cluster on ``hosts``: the controller on ``controller``, a ``slurmd`` on each of
    ``nodes`` with ``gpus`` fake GPUs and ``cpus`` CPUs; its files under ``root`` (a
    directory the hosts share)."""

    def __init__(
        self,
        hosts: Hosts,
        root: Path,
        *,
        controller: str,
        nodes: Sequence[str],
        gpus: int = 2,
        cpus: int = 2,
    ) -> None:
        self.hosts, self.controller, self.nodes = hosts, controller, list(nodes)
        self.root = root / "slurm"
        self.conf = self.root / "slurm.conf"
        self.gpus, self.cpus = gpus, cpus
        self.env = {"SLURM_CONF": str(self.conf)}
        self.daemons: dict[tuple[str, str], HostProcess] = {}

    def __enter__(self) -> Slurm:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the cluster -----------------------------------------------------------------

    def start(self) -> None:
        """Write the configuration, start munged everywhere, the controller, then every
        node's slurmd; return once every node is idle."""
        self._write_config()
        for host in [self.controller, *self.nodes]:
            self._start_munged(host)
        self._start("slurmctld", self.controller, ["slurmctld", "-D", "-i"])
        for node in self.nodes:
            self.start_slurmd(node)
        self.wait_for_nodes(self.nodes, "idle", 60)

    def stop(self) -> None:
        for process in self.daemons.values():
            if process.poll() is None:
                process.terminate()
        for process in self.daemons.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()

    def start_slurmd(self, node: str) -> None:
        """``slurmd`` on ``node`` (its munged first, if the host was started again)."""
        if ("munged", node) in self.daemons and self.daemons["munged", node].poll() is not None:
            self._start_munged(node)
        (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
        self._start("slurmd", node, ["slurmd", "-D", "-N", node])

    def run(self, argv: Sequence[str], *, timeout: float = 60, check: bool = True,
            env: Mapping[str, str] | None = None, cwd: Path | None = None,
            ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """A Slurm command (``sbatch``, ``squeue``...) on the controller's host."""
        return self.hosts.run(
            self.controller, argv, env={**self.env, **(env or {})}, cwd=cwd,
            timeout=timeout, check=check,
        )  # fmt: skip

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        return dict(line.split()[:2] for line in out.splitlines() if line.strip())

    def wait_for_nodes(self, nodes: Sequence[str], state: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.node_states()
            if all(states.get(node, "").rstrip("*~#") == state for node in nodes):
                return
            dead = [f"{d} on {h}" for (d, h), p in self.daemons.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise AssertionError(
                    f"{', '.join(dead) or 'nothing'} exited; nodes not {state} after "
                    f"{timeout_s:g} s: {states}\n{self.tails()}"
                )
            time.sleep(0.5)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, NodeList, Restarts...); {} if gone."""
        out = self.run(["scontrol", "-o", "show", "job", job_id], check=False).stdout
        fields = {}
        for word in out.split():
            key, sep, value = word.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def hostnames(self, nodelist: str) -> list[str]:
        """``h[2-3]`` -> ``[h2, h3]``, as Slurm expands it."""
        return self.run(["scontrol", "show", "hostnames", nodelist]).stdout.split()

    def tails(self, chars: int = 2000) -> str:
        paths = sorted((self.root / "log").glob("*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in paths)

    # --- inside ----------------------------------------------------------------------

    def _start(self, daemon: str, host: str, argv: Sequence[str]) -> None:
        log = self.root / "log" / f"{daemon}-{host}.out"
        self.daemons[daemon, host] = self.hosts.start(host, argv, env=self.env, log=log)

    def _start_munged(self, host: str) -> None:
        munge = self.root / "munge"
        argv = [
            "sh", "-c", 'mkdir -p -m 0755 /run/munge && exec "$@"', "munged",
            "munged", "-F", "-f", f"--key-file={munge / 'munge.key'}",
            f"--log-file={self.root / 'log' / f'munged-{host}.log'}",
            f"--seed-file={munge / f'seed-{host}'}",
        ]  # fmt: skip
        self._start("munged", host, argv)
        deadline = time.monotonic() + 20
        while self.hosts.run(host, ["test", "-S", "/run/munge/munge.socket.2"], check=False
                             ).returncode != 0:  # fmt: skip
            if time.monotonic() > deadline or self.daemons["munged", host].poll() is not None:
                raise RuntimeError(f"munged did not start on {host}\n{self.tails()}")
            time.sleep(0.1)

    def _write_config(self) -> None:
        for sub in ("state", "spool", "log", "munge", "gpus"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        for i in range(self.gpus):
            # As /dev/nvidiaN are (major 195): Slurm only looks at them, nothing opens them.
            gpu = self.root / "gpus" / f"gpu{i}"
            if not gpu.exists():
                os.mknod(gpu, stat.S_IFCHR | 0o666, os.makedev(195, i))
        self.root.chmod(0o755)  # munged refuses a key under a directory others may write
        addresses = {name: self.hosts.address(name) for name in [self.controller, *self.nodes]}
        node_lines = "".join(
            f"NodeName={node} NodeAddr={addresses[node]} CPUs={self.cpus} RealMemory=1000 "
            f"{f'Gres=gpu:{self.gpus} ' if self.gpus else ''}State=UNKNOWN\n"
            for node in self.nodes
        )
        r = self.root
        self.conf.write_text(
            f"ClusterName=asyncrl\n"
            f"SlurmctldHost={self.controller}({addresses[self.controller]})\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            # A requeued job waits out the credentials' lifetime (120 s by default).
            "AuthType=auth/munge\nAuthInfo=cred_expire=10\nCryptoType=crypto/munge\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "MpiDefault=none\nSwitchType=switch/none\nGresTypes=gpu\n"
            "ReturnToService=2\nJobRequeue=1\n"
            # A dead node is found and its job requeued in seconds, not minutes.
            "SlurmdTimeout=10\nSlurmctldTimeout=10\nMessageTimeout=5\nKillWait=5\n"
            "InactiveLimit=0\nMinJobAge=300\nWaitTime=0\nHealthCheckInterval=0\n"
            f"StateSaveLocation={r}/state\nSlurmdSpoolDir={r}/spool/%n\n"
            f"SlurmctldPidFile={r}/state/slurmctld.pid\nSlurmdPidFile={r}/spool/slurmd-%n.pid\n"
            f"SlurmctldLogFile={r}/log/slurmctld.log\nSlurmdLogFile={r}/log/slurmd-%n.log\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            f"{node_lines}"
            f"PartitionName={PARTITION} Nodes={','.join(self.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP\n"
        )
        gres = "".join(
            f"NodeName={node} Name=gpu File={r}/gpus/gpu[0-{self.gpus - 1}]\n"
            for node in self.nodes
        ) if self.gpus else ""  # fmt: skip
        (self.root / "gres.conf").write_text("AutoDetect=off\n" + gres)
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
