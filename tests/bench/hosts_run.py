"""The default run over hosts, beside the same run on one host: what splitting it costs.

    sudo python -m tests.bench.hosts_run [--steps 200] [--layouts one,three,four]
        [--limit-rate 100mbit[,2mbit]] [--repeat N] [--work DIR] [section.key=value ...]

Every layout is ``deploy/configs/default.yaml`` (the embedded model learning long addition)
run by one ``asyncrl node`` per host (tests/support/host_run.py), the first with the
scheduler, the bus over TCP with CURVE on, only the run directory shared:

- ``one``: one host runs everything. Not ``asyncrl run``: that one talks over ipc://
  without CURVE, so it would differ in more than the split; here the bus, the keys and the
  supervisor are the same as in the other layouts, and only the placement changes;
- ``three``: h1 the scheduler, dataloader and reward; h2 the generator; h3 the trainer and
  logp. Payloads cross hosts over ZeroMQ, weights go from h3 to h2 over UCX;
- ``four``: the same and a second generator on h4 (``--first-index 1``: its own name and
  seed; only generator 0 validates), with ``weights.relay_fanout=1`` so the trainer sends
  each version to one generator and that one relays it to the other.

``--limit-rate R`` (tc's units; several, comma-separated) adds, for each rate, the
``three`` layout with h2's link (the generator's host) held to R both ways by a token
bucket (``tc qdisc ... tbf``: this machine's kernel has no netem, so no delay or loss).

Per layout (medians over ``--repeat`` runs, their spread beside them): the wall time from
the nodes' start to their exit; steps per second on the scheduler's clock from the first
step to the last (start-up left out); the final validation reward; the bytes each host's
``eth0`` sent and received per step (its counters over the run, divided by the steps); and
the time for a version to reach every generator: the scheduler's ``published_to_loaded_s``
(from the trainer's announcement to the moment every generator runs that version or a newer
one; metrics.jsonl's ``versions_loaded``), median and p90 over the versions. Every run is
checked to have trained every step once and every group once, none dead; in ``four``, which
generator relayed to which. Ratios are against ``one`` (rate-limited runs: also against
``three``). Needs root (namespaces); the hosts share this machine's cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.host_run import HostRun, lines
from tests.support.hosts import Hosts, Traffic, why_no_hosts

THREE = {"h1": "dataloader,reward", "h2": "generate=1", "h3": "train,logp"}


@dataclass(frozen=True)
class Layout:
    name: str
    placement: Mapping[str, str]  # host -> its node's --roles (h1 also runs the scheduler)
    first_index: Mapping[str, int] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()
    limit: str = ""  # tc rate on h2's link, both ways; "" none


LAYOUTS = {
    "one": Layout("one", {"h1": "dataloader,reward,generate=1,train,logp"}),
    "three": Layout("three", THREE),
    "four": Layout("four", {**THREE, "h4": "generate=1"}, {"h4": 1}, ("weights.relay_fanout=1",)),
}


@dataclass
class Outcome:
    layout: str
    wall_s: float
    steps_per_s: float
    val: float | None
    per_step: dict[str, Traffic]  # host -> bytes sent, received per step
    delivery: list[float]  # seconds from publication to every generator, per version
    relays: dict[str, int]  # "source -> generator" -> versions fetched that way
    groups: dict[str, int]


# --- from a run's records (pure) ------------------------------------------------------


def delivery_times(metrics: Iterable[Mapping[str, Any]]) -> list[float]:
    """Seconds from each version's publication to every generator running it (or a newer
    one), in step order, from the step lines' ``versions_loaded``; versions the scheduler
    saw published before a restart of its own (no publication time) are left out."""
    found = {
        leg["step"]: leg["published_to_loaded_s"]
        for line in metrics
        for leg in line.get("versions_loaded") or ()
        if "published_to_loaded_s" in leg
    }
    return [found[step] for step in sorted(found)]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by linear interpolation (``q`` 0.5: the median)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def steps_per_second(metrics: Sequence[Mapping[str, Any]]) -> float:
    """Steps per second on the scheduler's clock, from the first step line to the last."""
    if len(metrics) < 2:
        return float("nan")
    first, last = metrics[0], metrics[-1]
    return (last["step"] - first["step"]) / max(last["elapsed_s"] - first["elapsed_s"], 1e-9)


def relays(loads: Iterable[Mapping[str, Any]], role: str = "generate") -> dict[str, int]:
    """How many versions each ``role`` worker fetched from each source: "source -> worker"."""
    return dict(
        Counter(
            f"{m['source']} -> {m['worker']}" for m in loads if m["worker"].startswith(f"{role}-")
        )
    )


def per_step(before: Traffic, after: Traffic, steps: int) -> Traffic:
    return Traffic((after.sent - before.sent) // steps, (after.received - before.received) // steps)


# --- running a layout --------------------------------------------------------------------


def run_layout(layout: Layout, steps: int, work: Path, overrides: Sequence[str]) -> Outcome:
    root = Path(tempfile.mkdtemp(prefix=f"{layout.name}-", dir=work))
    count = max(int(host[1:]) for host in layout.placement)
    with Hosts(count, shared=[root]) as hosts:
        if layout.limit:
            hosts.limit_rate("h2", layout.limit)
        run = HostRun(hosts, root, overrides=[f"run.total_steps={steps}", *layout.overrides,
                                              *overrides])  # fmt: skip
        before = {name: hosts.counters(name) for name in hosts.names()}
        started = time.monotonic()
        run.start(layout.placement, first_index=layout.first_index)
        run.finish(timeout_s=60 + 20 * steps)
        wall_s = time.monotonic() - started
        after = {name: hosts.counters(name) for name in hosts.names()}
    groups = run.check_exactly_once(steps)
    metrics = run.steps()
    vals = lines(run.run_dir / "validation.jsonl")
    return Outcome(
        layout=layout.name,
        wall_s=wall_s,
        steps_per_s=steps_per_second(metrics),
        val=vals[-1]["val_reward"] if vals else None,
        per_step={h: per_step(before[h], after[h], steps) for h in before},
        delivery=delivery_times(metrics),
        relays=relays(lines(run.run_dir / "weights.jsonl")),
        groups=groups,
    )


# --- printing ------------------------------------------------------------------------------


def _spread(values: Sequence[float], fmt: str) -> str:
    middle = format(statistics.median(values), fmt)
    if len(values) < 2:
        return middle
    return f"{middle} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def _kb(n: float) -> str:
    return f"{n / 1e3:.0f}"


def report(results: Mapping[str, list[Outcome]]) -> None:
    base = results.get("one") or next(iter(results.values()))
    three = results.get("three")
    rate0 = statistics.median(o.steps_per_s for o in base)
    hosts = sorted({h for runs in results.values() for o in runs for h in o.per_step})
    head = ["wall s", "steps/s", "vs one", "final val", "to gens p50 s", "p90 s"]
    head += [f"{h} kB out/in per step" for h in hosts]
    print("\n" + " | ".join(["layout", *head]))
    for name, runs in results.items():
        rate = statistics.median(o.steps_per_s for o in runs)
        ratio = f"{rate / rate0:.2f}x"
        if three and name.startswith("three @"):
            ratio += f" ({rate / statistics.median(o.steps_per_s for o in three):.2f}x of three)"
        vals = [o.val for o in runs if o.val is not None]
        cells = [
            _spread([o.wall_s for o in runs], ".0f"),
            _spread([o.steps_per_s for o in runs], ".3f"),
            ratio,
            _spread(vals, ".3f") if vals else "none",
            _spread([quantile(o.delivery, 0.5) for o in runs], ".3f"),
            _spread([quantile(o.delivery, 0.9) for o in runs], ".3f"),
        ]
        for h in hosts:
            seen = [o.per_step[h] for o in runs if h in o.per_step]
            cells.append(
                f"{_kb(statistics.median(t.sent for t in seen))}/"
                f"{_kb(statistics.median(t.received for t in seen))}"
                if seen
                else "-"
            )
        print(" | ".join([name, *cells]))
    for name, runs in results.items():
        for o in runs:
            print(f"{name}: weights fetched {o.relays or 'none (mapped on the trainer host)'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--layouts", default="one,three,four")
    parser.add_argument("--limit-rate", default="", help="tc rates for h2 in 'three', e.g. 8mbit")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--work", type=Path, default=None, help="where the runs are kept")
    parser.add_argument("overrides", nargs="*", help="section.key=value for every run")
    args = parser.parse_args(argv)
    reason = why_no_hosts()
    if reason is not None:
        print(f"cannot run: {reason}")
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="asyncrl-hosts-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    plan = [LAYOUTS[name] for name in args.layouts.split(",") if name]
    plan += [Layout(f"three @{r}", THREE, limit=r) for r in args.limit_rate.split(",") if r]
    results: dict[str, list[Outcome]] = {}
    for round_ in range(args.repeat):
        for layout in plan:  # interleaved, so that a change in the machine's load hits all
            print(f"{layout.name} (run {round_ + 1}), {args.steps} steps ...", flush=True)
            outcome = run_layout(layout, args.steps, work, args.overrides)
            results.setdefault(layout.name, []).append(outcome)
            print(f"  {outcome.wall_s:.0f} s, {outcome.steps_per_s:.3f} steps/s, "
                  f"validation {outcome.val}, groups {outcome.groups}", flush=True)  # fmt: skip
    report(results)
    print(f"(runs kept in {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
