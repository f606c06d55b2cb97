"""A run of the embedded default over hosts (tests/support/hosts.py), as on a cluster: one
``asyncrl node`` per host, the first with the scheduler, only the run directory shared.

What the multi-host tests and benches share: where the scheduler listens, the config the
nodes are started with, their logs, and the checks that a run ended exactly (every step
once, every group trained once, none dead).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.scheduler.replay import replay_journal

from .hosts import HostProcess, Hosts

__all__ = ["CONTROL_PORT", "HostRun", "lines"]

CONTROL_PORT = 5555  # fixed: a restarted scheduler serves where the workers dial again
GROUPS_PER_STEP = 8  # the default config's train batch


def check_exactly_once(
    run_dir: Path, steps: int, tails: Callable[[], str] = lambda: ""
) -> dict[str, int]:
    """A run's every step 1..steps once, every group trained once, none dead (from its
    metrics and its journal, whatever engine ran it); the journal's group counts."""
    metrics = lines(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)), tails()
    trained = Counter(key for m in metrics for key in m["keys"])
    assert len(trained) == steps * GROUPS_PER_STEP and set(trained.values()) == {1}
    groups = replay_journal(RunDir(run_dir))["groups"]
    assert groups.get("trained") == steps * GROUPS_PER_STEP and not groups.get("dead"), groups
    return dict(groups)


def lines(path: Path) -> list[dict[str, Any]]:
    """The whole JSON lines of ``path`` so far (a line being written is left out)."""
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


class HostRun:
    """The default config (or ``config``) over ``hosts``, the scheduler on ``scheduler_host``.

    ``overrides`` go to every node (after the run's own: run.dir, the scheduler's address
    and fixed ports, CURVE on). Each node's output is ``logs/node-HOST.log``; its
    workers' logs are in the run directory's ``logs/``.
    """

    def __init__(self, hosts: Hosts, root: Path, scheduler_host: str = "h1",
                 overrides: Sequence[str] = (),
                 config: str = "deploy/configs/default.yaml") -> None:  # fmt: skip
        self.hosts = hosts
        self.scheduler_host = scheduler_host
        self.run_dir, self.logs = root / "run", root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        address = hosts.address(scheduler_host)
        self.config = [
            "-c", config,
            f"run.dir={self.run_dir}",
            f"scheduler.host={address}",
            "scheduler.curve='on'",
            f"scheduler.control_port={CONTROL_PORT}",
            f"scheduler.events_port={CONTROL_PORT + 1}",
            *overrides,
        ]  # fmt: skip
        self.nodes: dict[str, HostProcess] = {}

    def start(self, placement: Mapping[str, str], *, resume: bool = False,
              first_index: Mapping[str, int] | None = None) -> None:  # fmt: skip
        """One node per host of ``placement`` (host -> its ``--roles``), the scheduler's
        first; a host named twice is started again (after a kill). ``first_index``: a
        host's ``--first-index`` (0 where not named), so that generators on several hosts
        get their own seeds and only the one numbered 0 validates."""
        for host in sorted(placement, key=lambda h: h != self.scheduler_host):
            index = (first_index or {}).get(host, 0)
            self.start_node(host, placement[host], resume=resume, first_index=index)

    def start_node(self, host: str, roles: str, *, resume: bool = False,
                   first_index: int = 0) -> HostProcess:  # fmt: skip
        if host == self.scheduler_host and "scheduler" not in roles.split(","):
            roles = f"scheduler,{roles}" if roles else "scheduler"
        argv = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "node", *self.config]
        argv += ["--roles", roles, "--node", host, "--first-index", str(first_index)]
        if resume and host == self.scheduler_host:
            argv.append("--resume")
        self.nodes[host] = self.hosts.start(host, argv, log=self.node_log(host))
        return self.nodes[host]

    def node_log(self, host: str) -> Path:
        return self.logs / f"node-{host}.log"

    def steps(self) -> list[dict[str, Any]]:
        return lines(self.run_dir / "metrics.jsonl")

    def wait_for_steps(self, count: int, timeout_s: float) -> None:
        self.wait_for(lambda: len(self.steps()) >= count, timeout_s, f"{count} steps")

    def wait_for(self, condition: Callable[[], object], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= deadline:
                raise AssertionError(f"no {what} within {timeout_s:g} s\n{self.tails()}")
            time.sleep(0.1)

    def child_pid(self, host: str, child: str) -> int:
        """The pid (in the test's view) of the newest start of ``child`` under ``host``'s
        node; the node's log names the pid as its host sees it."""
        found = re.findall(
            rf"started {re.escape(child)} \(pid (\d+)", self.node_log(host).read_text()
        )
        if not found:
            raise AssertionError(f"{child} never started on {host}\n{self.tails()}")
        return self.hosts.pid_on_host(host, int(found[-1]))

    def finish(self, timeout_s: float = 180) -> None:
        """Every node ends by itself with 0 (the run is over); one that exits otherwise,
        or a run past ``timeout_s``, fails at once with what they all said."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                codes = {host: node.poll() for host, node in self.nodes.items()}
                failed = {host: code for host, code in codes.items() if code not in (None, 0)}
                assert not failed, f"nodes exited {failed}\n{self.tails()}"
                if all(code == 0 for code in codes.values()):
                    return
                assert time.monotonic() < deadline, f"nodes still running {codes}\n{self.tails()}"
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Ctrl-C to every node still running (a test that failed): nothing may outlive it."""
        for host, node in self.nodes.items():
            if node.poll() is None and self.hosts.is_up(host):
                node.send_signal(signal.SIGINT)
        for node in self.nodes.values():
            try:
                node.wait(30)
            except Exception:
                node.kill()

    def check_exactly_once(self, steps: int) -> dict[str, int]:
        """Every step 1..steps once, every group trained once, none dead; the journal's
        group counts."""
        return check_exactly_once(self.run_dir, steps, self.tails)

    def tails(self, chars: int = 2500) -> str:
        """The end of every node's output and every worker's log, for a failure message."""
        paths = sorted(self.logs.glob("*.log")) + sorted((self.run_dir / "logs").glob("*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in paths)
