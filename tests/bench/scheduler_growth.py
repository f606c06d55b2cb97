"""Benchmark: what a long run costs the one scheduler: its memory, and its restart.

    python -m tests.bench.scheduler_growth [--groups 100000] [--records 10000,100000,1000000]

1. Memory: the real core holding ``--groups`` groups at once (a dataloader's backlog,
   a fifth of them leased to 64 generators, half of those generated with a data-plane
   reference each, scored by logp and reward workers), measured with tracemalloc (what
   the core's objects hold) and as the process's RSS growth; and what a long run leaves
   behind: the core after that many groups were trained (trained groups leave the table;
   their keys stay, to refuse a key offered twice; the prompts of steps not yet durable
   stay too, the trainer checkpointing every 50 steps).
2. Restart: a journal of each size in ``--records``, written by the real core and journal
   (``JournaledCore``, the busy pipeline of tests/support/pipeline_driver.py) with
   snapshots every ``scheduler.snapshot_every`` records (10,000 by default) and without
   any, then read back and replayed into a core the way ``--resume`` does (``recover``):
   seconds, and how many records were replayed after the snapshot.

Prints one table per part. The unit tests
(tests/unit/runtime/scheduler/test_scheduler_growth.py) bound
the same measures at a small scale.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.core.effects import Grant
from asyncrl.runtime.scheduler.durable import JournaledCore, recover
from asyncrl.runtime.scheduler.journal import JournalWriter, Replay

from ..support.pipeline_driver import Sim

GENERATORS = 64
PROMPT = bytes(64)  # a dataloader's inline prompt payload, packed (the default task's size)
SNAPSHOT_EVERY = 10_000  # scheduler.snapshot_every's default
NO_SNAPSHOT = 1 << 62
CHECKPOINT_EVERY = 50  # pipeline.checkpoint_every's default: the trainer's state is durable


def reference(worker: str, key: int) -> list[object]:
    """What the core keeps of a payload left with its maker
    (runtime/scheduler/service/payload_refs)."""
    return [worker, "tcp://10.0.0.1:40000", f"store-{worker}", key, 65536, 123456789, "node-1"]


def known_groups(groups: int, in_flight: float = 0.2) -> SchedulerCore:
    """A core holding ``groups`` groups: pending, leased, generated, being scored."""
    admitted = int(groups * in_flight)
    settings = CoreSettings(max_staleness=1, train_batch_groups=max(1, admitted), max_attempts=3)
    core = SchedulerCore(settings)
    workers = [f"gen{i}" for i in range(GENERATORS)]
    for worker in workers:
        core.register(worker, "generate", 0.0)
        core.loaded_version(worker, 0)
    for role in ("logp", "ref_logp", "reward", "train"):
        core.register(f"{role}0", role, 0.0)
    core.add_groups([f"prompt-{i:09d}" for i in range(groups)], [PROMPT] * groups)
    per_worker = max(1, admitted // GENERATORS)
    for i, worker in enumerate(workers):
        grant = core.claim("generate", worker, per_worker, 0.0)
        if isinstance(grant, Grant) and i % 2 == 0:  # half of them done: rollouts by reference
            gids = list(grant.groups)
            refs = [reference(worker, gid) for gid in gids]
            core.complete(grant.lease_id, grant.fence, gids, [(0, 0)] * len(gids), refs)
    for role in ("logp", "reward"):
        core.claim(role, f"{role}0", max(1, admitted // 8), 0.0)
    core.drain()
    return core


def trained_run(groups: int) -> SchedulerCore:
    """A core after a busy run trained ``groups`` groups (records dropped)."""
    core = SchedulerCore(CoreSettings(max_staleness=2, train_batch_groups=16, max_attempts=3))
    Sim(core, lambda: core.drain()[1], groups, durable_every=CHECKPOINT_EVERY).run()
    return core


@dataclass(frozen=True)
class Footprint:
    traced: int  # bytes tracemalloc sees the build leave allocated
    rss: int  # the process's RSS growth, bytes (0 where /proc is missing)


def footprint(build: Callable[[], object], rss: bool = False) -> tuple[object, Footprint]:
    """What ``build()``'s result holds, while it is kept alive; with ``rss``, also the
    process's RSS growth, from a first build without tracemalloc (whose own bookkeeping
    would count), let go before the traced one."""
    grown = 0
    if rss:
        gc.collect()
        before = rss_bytes()
        first = build()
        gc.collect()
        grown = max(0, rss_bytes() - before)
        del first
        gc.collect()
    tracemalloc.start()
    try:
        built = build()
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return built, Footprint(traced, grown)


def rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# --- the journal ---------------------------------------------------------------------


def write_journal(directory: Path, records: int, snapshot_every: int) -> JournaledCore:
    """At least ``records`` records of a busy run, journaled as the scheduler does."""
    settings = CoreSettings(max_staleness=2, train_batch_groups=16, max_attempts=3)

    def writer(path: Path) -> JournalWriter:
        return JournalWriter.open(path, snapshot_every=snapshot_every)

    # On a stopped clock: snapshots by record count alone, as a scheduler whose snapshots
    # are cheap beside its pace has them (the cost rule, durable.py, can stretch the tail
    # to SNAPSHOT_CAP times snapshot_every records; the table's row without a snapshot
    # at that count is what that costs).
    durable = JournaledCore.open(
        directory, settings, resume=False, now=0.0, writer_factory=writer, clock=lambda: 0.0
    )
    sim = Sim(durable.core, durable.commit, groups=1 << 62, durable_every=CHECKPOINT_EVERY)
    sim.start()
    while durable.writer.last_seq < records:
        sim.step()
    durable.close()
    return durable


@dataclass(frozen=True)
class Restart:
    seconds: float
    found: Replay
    core: SchedulerCore


def restart(directory: Path) -> Restart:
    """Read the journal back and rebuild the core, as ``--resume`` does."""
    settings = CoreSettings(max_staleness=2, train_batch_groups=16, max_attempts=3)
    gc.collect()
    start = time.perf_counter()
    core, found = recover(directory, settings)
    return Restart(time.perf_counter() - start, found, core)


# --- the report ----------------------------------------------------------------------


def memory_table(groups: int) -> None:
    print(f"scheduler core memory ({groups:,} groups)")
    print(f"  {'what':<44} {'traced':>10} {'per group':>10} {'RSS growth':>11}")
    held, known = footprint(lambda: known_groups(groups), rss=True)
    counts = held.state.counts  # type: ignore[attr-defined]
    _memory_row(f"{groups:,} known", known, groups)
    print("  " + ", ".join(f"{n:,} {s.value}" for s, n in counts.items() if n))
    del held
    ran, trained = footprint(lambda: trained_run(groups), rss=True)
    steps = ran.state.steps_done  # type: ignore[attr-defined]
    _memory_row(f"after {groups:,} trained ({steps:,} steps)", trained, groups)
    print()


def _memory_row(what: str, f: Footprint, groups: int) -> None:
    print(f"  {what:<44} {_mb(f.traced):>10} {f.traced / groups:>8,.0f} B {_mb(f.rss):>11}")


def replay_table(sizes: list[int]) -> None:
    print("journal replay on restart (recover: read, verify, decode, apply)")
    header = f"  {'records':>10} {'snapshot':>9} {'journal':>9} {'replayed':>9} {'seconds':>8}"
    print(f"{header} {'groups known':>12}")
    for records in sizes:
        for every in (SNAPSHOT_EVERY, NO_SNAPSHOT):
            with tempfile.TemporaryDirectory() as tmp:
                durable = write_journal(Path(tmp), records, every)
                size = sum(f.stat().st_size for f in Path(tmp).iterdir())
                done = restart(Path(tmp))
                assert done.core.state.steps_done == durable.core.state.steps_done
            snap = f"{SNAPSHOT_EVERY:,}" if every == SNAPSHOT_EVERY else "none"
            print(
                f"  {durable.writer.last_seq:>10,} {snap:>9} {_mb(size):>9} "
                f"{len(done.found.records):>9,} {done.seconds:>8.2f} "
                f"{len(done.core.state.groups):>12,}"
            )


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--records", default="10000,100000,1000000")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, pid {os.getpid()}")
    memory_table(args.groups)
    replay_table([int(n) for n in args.records.split(",")])


if __name__ == "__main__":
    main()
