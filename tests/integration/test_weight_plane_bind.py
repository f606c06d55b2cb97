"""A local run's weight plane listens on loopback only: the trainer's and the generator's
UCX nodes, started by the real roles against a scheduler on ipc://, open no TCP port on
any other address (before, UCX listened on every interface, unauthenticated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster, wait_for
from tests.support.listeners import listening

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(120)]


def runs_ucx(pid: int) -> bool:
    return "libucp" in Path(f"/proc/{pid}/maps").read_text()


def is_loopback(host: str) -> bool:
    return host in ("::1", "::ffff:127.0.0.1") or host.startswith("127.")


def test_a_local_runs_trainer_and_generator_listen_on_loopback_only(tmp_path: Path) -> None:
    c = Cluster(
        tmp_path,
        pipeline={"actors": "asyncrl.actors.roles", "lease_timeout_s": 60.0},
        algorithm={"kl_coef": 0.0},
        run={"total_steps": 1000},
    )
    try:
        argv = ["asyncrl.runtime.scheduler.cli", "start", "-c", str(c.config_path), "--ipc"]
        c.spawn("scheduler", argv)
        wait_for(lambda: c.endpoints() is not None, 30, "the scheduler's endpoints.json")
        assert c.endpoints()["control"].startswith("ipc://")  # type: ignore[index]
        workers = {role: c.worker(role) for role in ("train", "generate")}
        # Lines each logs once its UCX node is made (with every listener it will open).
        started = {"train": "trainer state restored", "generate": "loaded a policy version"}
        for role, line in started.items():
            log = f"{role}-0"
            wait_for(lambda log=log, line=line: line in c.log_text(log), 90, f"{log}: {line}")
        for role, pid in workers.items():
            assert c.procs[f"{role}-0"].poll() is None, c.log_text(f"{role}-0")
            opened = listening(pid)
            assert runs_ucx(pid) and opened, (role, opened)
            assert all(is_loopback(host) for host, _ in opened), (role, opened)
    finally:
        c.stop_all()
