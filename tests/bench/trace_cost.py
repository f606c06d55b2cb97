"""What trace.json costs the scheduler's loop: microseconds per lease (grant and end, the
two calls the service makes per lease) and per instant, on this machine.

    python -m tests.bench.trace_cost [--leases 200000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from asyncrl.runtime.scheduler.core.effects import Grant
from asyncrl.runtime.scheduler.service.trace import TraceLog


def measure(leases: int, directory: Path) -> dict[str, float]:
    trace = TraceLog(directory / "trace.json", now=0.0, wall_offset_s=1.7e9)
    workers = [f"generate-{i}" for i in range(8)]
    live: set[int] = set()
    start = time.perf_counter()
    for lid in range(1, leases + 1):
        trace.granted(Grant(lid, 1, "generate", 60.0, (lid,), 3), workers[lid % 8], lid * 1e-3)
        trace.settled(lid, "complete", live, lid * 1e-3 + 5e-4)
        if lid % 1000 == 0:
            trace.tick(lid * 1e-3)
    per_lease = (time.perf_counter() - start) / leases
    start = time.perf_counter()
    for step in range(leases):
        trace.loaded(workers[step % 8], step, step * 1e-3)
    per_instant = (time.perf_counter() - start) / leases
    trace.close()
    size = (directory / "trace.json").stat().st_size
    return {
        "us_per_lease": per_lease * 1e6,
        "us_per_instant": per_instant * 1e6,
        "bytes_per_event": size / trace.events,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leases", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(args.leases, Path(tmp))
    print(" · ".join(f"{k} {v:.2f}" for k, v in result.items()))


if __name__ == "__main__":
    main()
