"""The scale bench's curve as a picture (``python -m tests.bench.scale --plot PATH``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .scale import Point


def plot(points: list[Point], path: Path, mean_lease: float) -> None:
    """Three panels over N: leases granted per second, the claim-to-lease latency, and
    the scheduler's CPU per lease beside the share of ideal work."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [pt.workers for pt in points]
    fig, (rate, wait, cost) = plt.subplots(1, 3, figsize=(12, 3.6), constrained_layout=True)
    rate.plot(n, [pt.leases_per_s for pt in points], "o-")
    rate.set(title="leases granted per second", xlabel="workers")
    wait.plot(n, [pt.p50_ms for pt in points], "o-", label="p50")
    wait.plot(n, [pt.p99_ms for pt in points], "s-", label="p99")
    wait.set(title="claim to lease (ms)", xlabel="workers", yscale="log")
    wait.legend()
    cost.plot(n, [pt.cpu_per_lease_ms for pt in points], "o-", label="scheduler CPU per lease")
    cost.set(title="scheduler CPU per lease (ms)", xlabel="workers", ylim=(0, None))
    share = cost.twinx()
    share.plot(n, [100 * pt.ideal_share for pt in points], "^--", color="tab:green")
    share.set(ylabel="% of ideal work (triangles)", ylim=(0, 105))
    for ax in (rate, wait, cost):
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(x) for x in n])
        ax.grid(alpha=0.3)
    fig.suptitle(f"one scheduler, N simulated workers (mean lease {mean_lease:g} s, "
                 f"{os.cpu_count()} cores shared with the load generator)")  # fmt: skip
    fig.savefig(path, dpi=110)
    plt.close(fig)
