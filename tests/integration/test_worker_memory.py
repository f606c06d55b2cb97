"""What a worker costs: a role that does no tensor work never imports torch.

Many such workers stand beside each GPU node's generators (reward, harness), so each must
be small. A dataloader and a rule-based reward worker of the default config run against a
real scheduler, fed by a real generator; while they work, each holds at most 80 MB and
has no torch library mapped. (With torch, each held about 320 MB.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, wait_for

pytestmark = pytest.mark.timeout(60)

MOST_RSS_MB = 80


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def mapped_torch(pid: int) -> list[str]:
    """The torch libraries the process has mapped (libtorch*, torch/_C)."""
    paths = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()}
    return sorted(path for path in paths if "libtorch" in path or "/torch/" in path)


def leases_ended(c: Cluster, role: str) -> int:
    """Leases of ``role`` that ended, from the scheduler's trace.json (flushed on its tick)."""
    try:
        lines = (c.run_dir / "trace.json").read_text().splitlines()[1:]
    except FileNotFoundError:
        return 0
    events = []
    for line in lines:
        try:
            events.append(json.loads(line.lstrip(",")))
        except ValueError:
            continue  # a line torn by a write in progress
    return sum(1 for e in events if e.get("ph") == "X" and e.get("name") == role)


def test_a_dataloader_and_a_rule_based_reward_worker_hold_no_torch(tmp_path: Path) -> None:
    c = Cluster(
        tmp_path,
        # The real roles of the default config (its task, its rule-based reward).
        pipeline={"actors": "asyncrl.actors.roles", "lease_timeout_s": 60.0},
        algorithm={"kl_coef": 0.0},
        payloads={"inline_bytes": 1024, "fetch_timeout_s": 10.0},
        run={"total_steps": 1000},
    )
    try:
        c.scheduler()
        light = {role: c.worker(role) for role in ("dataloader", "reward")}
        c.worker("generate")  # computes: makes the rollouts the reward worker scores
        wait_for(lambda: leases_ended(c, "reward") >= 2, 45, "two reward leases done")
        for role, pid in light.items():
            assert c.procs[f"{role}-0"].poll() is None, c.log_text(f"{role}-0")
            assert mapped_torch(pid) == [], role
            assert rss_mb(pid) <= MOST_RSS_MB, (role, rss_mb(pid))
    finally:
        c.stop_all()
