"""Real scheduler and worker processes for integration tests, and checks of a run's results.

Every process is started with the console commands' modules (``python -m ...``), its output
kept in ``<tmp>/logs/<name>.log``, and killed when the test ends, however it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.demo_pipeline import expected_value, filtered_demo, prompt_key

ROLES = ("dataloader", "generate", "logp", "ref_logp", "reward", "train")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening_port() -> int:
    """A free port for a server to bind later or again on a restart (a scheduler's fixed
    ports). Not from the kernel's ephemeral range, as :func:`free_port`'s are: there, any
    outgoing connection on the machine (a reconnecting worker's, Ray's) may take it
    meanwhile, and the scheduler then cannot bind. Below that range, and above Ray's worker
    ports (10002-19999)."""
    low, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, max(20_001, min(low, 32_768)))
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("0.0.0.0", port))
            return port
    raise RuntimeError("no free port between 20000 and the ephemeral range")


class Cluster:
    """A run directory plus the processes of one test."""

    def __init__(self, root: Path, **sections: Mapping[str, Any]) -> None:
        self.root = root
        self.run_dir = root / "run"
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "run": {"dir": str(self.run_dir), "total_steps": 10},
            "pipeline": {
                "train_batch_groups": 2,
                "lease_timeout_s": 5.0,
                "actors": "tests.support.demo_pipeline",  # exact results per group
            },
            # The demo's table has every stage; ref_logp runs only under a KL penalty.
            "algorithm": {"kl_coef": 0.01},
            "scheduler": {
                "control_port": 0,
                "events_port": 0,
                "heartbeat_interval_s": 0.3,
                "worker_timeout_s": 2.0,
            },
            # Every result by reference, so every test exercises the data plane; a dead
            # holder is given up on quickly.
            "payloads": {"inline_bytes": 0, "fetch_timeout_s": 2.0},
            "logging": {"level": "info"},
        }
        for name, values in sections.items():
            config[name] = {**config.get(name, {}), **values}
        self.config = config
        self.config_path = root / "run.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    # --- processes -------------------------------------------------------------------

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> int:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        log.close()
        self.procs[name] = proc
        return proc.pid

    def scheduler(self, resume: bool = False) -> int:
        argv = ["asyncrl.runtime.scheduler.cli", "start", "-c", str(self.config_path)]
        pid = self.spawn("scheduler", [*argv, "--resume"] if resume else argv)
        proc = self.procs["scheduler"]
        try:
            # A scheduler that exits (a port taken) fails the test at once, with its reason.
            wait_for(
                lambda: self.endpoints() is not None or proc.poll() is not None,
                60,
                "the scheduler's endpoints.json",
            )
        except AssertionError as error:
            tail = self.log_text("scheduler")[-3000:]
            raise AssertionError(f"{error}; its log:\n{tail}") from None
        if self.endpoints() is None:
            raise AssertionError(
                f"the scheduler exited ({proc.returncode}) before it listened; its log:\n"
                + self.log_text("scheduler")[-3000:]
            )
        return pid

    def worker(self, role: str, index: int = 0, env: Mapping[str, str] | None = None) -> int:
        argv = ["asyncrl.actors.cli", "--role", role, "--index", str(index)]
        return self.spawn(f"{role}-{index}", [*argv, "-c", str(self.config_path)], env)

    def all_workers(self, env: Mapping[str, str] | None = None) -> None:
        for role in ROLES:
            self.worker(role, env=env)

    def signal(self, name: str, signum: int) -> None:
        self.procs[name].send_signal(signum)

    def status(self) -> dict[str, Any]:
        """The scheduler's status, asked over the bus as an observer would."""
        from asyncrl.transport import protocol as p

        from .runlink import run_link

        with run_link(self.run_dir, "observer") as link:
            reply = link.request(p.Status(), 5)
        assert isinstance(reply, p.StatusReply), reply
        return reply.summary

    def kill9(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def wait(self, name: str, timeout: float) -> int:
        return self.procs[name].wait(timeout)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait(10)

    def endpoints(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.run_dir / "endpoints.json").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def log_text(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    # --- results ---------------------------------------------------------------------

    def metrics(self) -> list[dict[str, Any]]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def steps_done(self) -> int:
        lines = self.metrics()
        return lines[-1]["step"] if lines else 0

    def check_exactly_once(self) -> None:
        """Every step once, every group's result once and right: a complete, exact run."""
        steps = self.config["run"]["total_steps"]
        batch = self.config["pipeline"]["train_batch_groups"]
        lines = self.metrics()
        assert [line["step"] for line in lines] == list(range(1, steps + 1))
        seen: Counter[str] = Counter()
        for line in lines:
            for key, value in line["groups"].items():
                seen[key] += 1
                assert value == expected_value(int(key[1:])), (key, value)
        assert max(seen.values()) == 1, [k for k, n in seen.items() if n > 1]
        assert len(seen) == steps * batch
        assert set(seen) <= {prompt_key(i) for i in range(10 * steps * batch)}
        if self.config.get("algorithm", {}).get("filter_groups", {}).get("enabled"):
            # trained, filtered or dead once each: no group the reward filtered was trained
            trained_filtered = sorted(k for k in seen if filtered_demo(int(k[1:])))
            assert not trained_filtered, trained_filtered
            last = lines[-1]
            assert last["groups_filtered"] > 0, last
            states = last["group_states"]
            assert sum(states.values()) == last["groups_created"], states


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found
