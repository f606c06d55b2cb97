"""The data plane with the in-process scheduler and real payload sockets: bytes that rot in
a holder's store, and stores that stay bounded over a long run.

Every role is a worker thread on one hub; every result goes by reference
(``payloads.inline_bytes=0``) over the workers' real payload servers.
"""

from __future__ import annotations

import threading
from pathlib import Path

from asyncrl.actors.worker.loop import Worker
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.transport import protocol as p
from tests.support.inprocess_hub import InProcessHub

from .test_inprocess_pipeline import (
    BATCH,
    _name_workers,
    _run_threads,
    check_every_value,
    demo_actors,
)


def by_reference(tmp_path: Path, steps: int) -> object:
    return config_from_dict(
        {
            "run": {"dir": str(tmp_path / "run"), "total_steps": steps},
            "pipeline": {"train_batch_groups": BATCH, "lease_timeout_s": 10.0},
            "algorithm": {"kl_coef": 0.01},  # the demo runs every stage, ref_logp included
            "scheduler": {"heartbeat_interval_s": 0.1},
            "payloads": {"inline_bytes": 0, "fetch_timeout_s": 2.0},
        }
    )


def worker_of(workers: list[Worker], role: str) -> Worker:
    return next(w for w in workers if w.role == role)


def rot_first(worker: Worker, count: int) -> list[p.PayloadRef]:
    """The next ``count`` payloads ``worker`` keeps have a flipped byte at rest."""
    store, keep, rotted = worker.payloads.store, worker.payloads.store.put_frames, []

    def put_frames(frames: list) -> p.PayloadRef:
        ref = keep(frames)  # checksummed while intact
        if len(rotted) < count:
            store._images[ref.key][-1] ^= 0xFF  # in shared memory: every reader sees it
            rotted.append(ref)
        return ref

    store.put_frames = put_frames  # type: ignore[method-assign]
    return rotted


def test_a_corrupt_payload_is_refetched_then_refused_and_made_again(tmp_path: Path) -> None:
    cfg = by_reference(tmp_path, steps=20)
    hub = InProcessHub(cfg)
    try:
        workers = _name_workers(hub, cfg, demo_actors())
        rotted = rot_first(worker_of(workers, "generate"), 2)
        assert set(_run_threads(workers, 60.0).values()) == {0}
        status = hub.service.status(hub.clock())
    finally:
        hub.close()
    assert len(rotted) == 2
    check_every_value(cfg)  # the regenerated groups trained with intact payloads
    assert status["regenerated"]["generate"] >= 1 and status["dead"] == {}
    readers = [worker_of(workers, r).payloads.fetcher for r in ("logp", "ref_logp", "reward")]
    assert sum(f.refetched for f in readers) >= 1  # asked once more before giving up


def test_every_store_stays_bounded_over_a_long_run(tmp_path: Path) -> None:
    steps = 100
    cfg = by_reference(tmp_path, steps=steps)
    hub = InProcessHub(cfg)
    peaks: dict[str, int] = {}
    done = threading.Event()
    try:
        workers = _name_workers(hub, cfg, demo_actors())

        def watch() -> None:
            while not done.wait(0.02):
                for w in workers:
                    held = w.payloads.store.stats().payloads
                    peaks[w.name] = max(peaks.get(w.name, 0), held)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        assert set(_run_threads(workers, 120.0).values()) == {0}
    finally:
        done.set()
        hub.close()
    made = steps * BATCH
    # What a store holds is what the pipeline has in flight (a few steps' worth, bounded
    # by the staleness bound), never what the run has made.
    bound = (cfg.pipeline.max_staleness + 4) * BATCH
    for role in ("generate", "logp", "ref_logp", "reward"):
        worker = worker_of(workers, role)
        assert worker.payloads.store._next_key - 1 >= made, role  # every group went through
        assert peaks[worker.name] <= bound, (role, peaks[worker.name], bound)
    assert peaks[worker_of(workers, "train").name] == 0  # the trainer keeps nothing
    print("payloads held at most:", peaks, "bound", bound, "made", made)
