"""Benchmark: the scheduler core through a long simulated run, with and without its journal.

    python -m tests.bench.core_throughput [--groups 100000] [--batch 16]

The same deterministic run (dataloader, 4 generators, logp, ref_logp, reward, trainer;
1% of generations fail and are retried) is driven twice in one process: once with the
records dropped, once journaled to disk with batched fsync and periodic snapshots. It
prints group state transitions per second for both, their ratio, journal bytes per
transition, and how long a restart takes to replay the journal.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from asyncrl.runtime.scheduler.core import CoreSettings, SchedulerCore
from asyncrl.runtime.scheduler.durable import JournaledCore, recover
from asyncrl.runtime.scheduler.journal import JournalWriter

from ..support.pipeline_driver import Sim


def timed(sim: Sim) -> float:
    start = time.perf_counter()
    sim.run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--fsync-every", type=int, default=256)
    parser.add_argument("--snapshot-every", type=int, default=10_000)
    args = parser.parse_args()
    settings = CoreSettings(max_staleness=2, train_batch_groups=args.batch, max_attempts=3)

    bare = SchedulerCore(settings)
    plain = Sim(bare, lambda: bare.drain()[1], args.groups)
    plain_s = timed(plain)

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)

        def writer(path: Path) -> JournalWriter:
            return JournalWriter.open(
                path, fsync_every=args.fsync_every, snapshot_every=args.snapshot_every
            )

        durable = JournaledCore.open(
            directory, settings, resume=False, now=0.0, writer_factory=writer
        )
        journaled = Sim(durable.core, durable.commit, args.groups)
        journal_s = timed(journaled)
        durable.close()
        stats = durable.writer.stats
        start = time.perf_counter()
        recovered, found = recover(directory, settings)
        replay_s = time.perf_counter() - start
        assert recovered.state.steps_done == durable.core.state.steps_done

    assert plain.transitions == journaled.transitions
    report(plain, plain_s, journaled, journal_s, stats, found, replay_s)


def report(plain, plain_s, journaled, journal_s, stats, found, replay_s) -> None:
    n = plain.transitions
    print(f"simulated run: {n} group transitions, {plain.core.state.steps_done} train steps")
    print(f"  core alone     : {n / plain_s:>12,.0f} transitions/s ({plain_s:.2f} s)")
    print(f"  core + journal : {n / journal_s:>12,.0f} transitions/s ({journal_s:.2f} s)")
    print(f"  journal cost   : {journal_s / plain_s:.2f}x the time of the core alone")
    print(
        f"  journal        : {stats.records} records, {stats.bytes_written / n:.1f} bytes per "
        f"transition, {stats.fsyncs} fsyncs ({stats.fsync_seconds:.2f} s, off the core's "
        f"thread), {stats.snapshots} snapshots"
    )
    print(
        f"  restart replay : {replay_s * 1000:.0f} ms "
        f"(snapshot at record {found.snapshot_seq}, then {len(found.records)} records)"
    )


if __name__ == "__main__":
    main()
