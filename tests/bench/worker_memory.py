"""Benchmark: what each process of a default run holds (RSS), and which load torch.

    python -m tests.bench.worker_memory [--steps 3]

Starts the scheduler and one worker of each role of the default config (the real roles,
deploy/configs/default.yaml's task and rule-based reward) as separate processes, waits
for ``--steps`` train steps, and prints each process's resident memory (VmRSS, and its
peak VmHWM) and whether it has torch's libraries mapped. The roles that do no tensor
work (dataloader, reward with a rule) must stay small: tests/integration/
test_worker_memory.py bounds them at 80 MB.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from ..support.cluster import Cluster, wait_for

ROLES = ("dataloader", "generate", "logp", "reward", "train")


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def has_torch(pid: int) -> bool:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return "libtorch" in maps or "/torch/" in maps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="asyncrl-memory-") as tmp:
        c = Cluster(
            Path(tmp),
            pipeline={"actors": "asyncrl.actors.roles", "lease_timeout_s": 60.0},
            algorithm={"kl_coef": 0.0},
            payloads={"inline_bytes": 1024, "fetch_timeout_s": 10.0},
            run={"total_steps": 1000},
        )
        try:
            pids = {"scheduler": c.scheduler()}
            pids.update({role: c.worker(role) for role in ROLES})
            wait_for(lambda: c.steps_done() >= args.steps, 300, f"{args.steps} train steps")
            print(f"after {c.steps_done()} train steps of the default run")
            print(f"  {'process':<11} {'RSS':>8} {'peak':>8}  torch")
            for name, pid in pids.items():
                rss, peak = status_kb(pid, "VmRSS") / 1024, status_kb(pid, "VmHWM") / 1024
                torch = "yes" if has_torch(pid) else "no"
                print(f"  {name:<11} {rss:>5.0f} MB {peak:>5.0f} MB  {torch}")
        finally:
            c.stop_all()


if __name__ == "__main__":
    main()
