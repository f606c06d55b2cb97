"""A version's publish from a group of 1, 2 and 4 ranks: gathered on rank 0 against every
rank publishing its own part (``weights.from_every_rank``, the default), side by side.

    python -m tests.bench.publish_parts [--layers 12] [--hidden 768] [--vocab 16000]
        [--ranks 1,2,4] [--runs 3]

A random Llama-shaped model (the 110M shape of tests.bench.train_memory by default) is
sharded over the group by the trainer's own code (the Learner: FSDP2 over gloo, real
processes). Each rank then publishes version 1 with a UCX publisher of its own, as a run's
ranks do: gathered, rank 0 gathers the whole model and stages it; from every rank, each
rank stages its own rows and rank 0 gathers the parts' announcements. A receiver in this
process (the generators' receiver) fetches the version and holds it whole.

Printed per group size and way, medians over ``--runs`` (each a fresh group):
- the busiest rank's memory for publishing: its peak resident memory from just before
  the publish to its end, above what it held before (Linux VmHWM; the staging buffers
  and, gathered, the whole model);
- the bytes each rank serves: what leaves its host when the receivers are on others;
- the publish's time on the slowest rank, and the time from the announcement to the
  receiver holding the version whole.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time

import torch

from tests.bench.train_memory import _reset_peak, _rss_kib, llama_shape
from tests.support.ranks import GROUP_SECRET, free_port, start_ranks

MiB = 1 << 20


def _rank(rank: int, size: int, port: int, shape: dict, parts: bool, out, done) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    from asyncrl.actors.policy.collectives import all_gather_data
    from asyncrl.actors.policy.model import CausalLM, ModelConfig
    from asyncrl.actors.training.gang import Gang
    from asyncrl.actors.training.learner import Learner
    from asyncrl.runtime.contract.config import config_from_dict
    from asyncrl.runtime.contract.gangs import GangPlace
    from asyncrl.transport.weights import Announcement
    from asyncrl.transport.weights.parts import compose
    from asyncrl.transport.weights.ucx import UcxPublisher

    gang = Gang(GangPlace(rank, size, "127.0.0.1", port), secret=GROUP_SECRET) if size > 1 else None
    torch.manual_seed(0)
    model = CausalLM(ModelConfig(**shape))
    learner = Learner(model, config_from_dict({}), pad_id=0, group_size=size)
    del model
    publisher = UcxPublisher()
    if gang is not None:
        dist.barrier()
    _reset_peak()  # returns what was freed first: the baseline after it
    before = _rss_kib("VmRSS")
    started = time.perf_counter()
    if parts and size > 1:
        own = learner.own_part()
        part, shapes = own.tensors, own.shapes
        mine = publisher.publish(1, part)
        every = all_gather_data([mine.version, mine.manifest, mine.address])
        parts = [Announcement(*said) for said in every]
        announced = compose(1, parts, shapes) if rank == 0 else None
        served = mine.manifest["total"]
    else:
        weights = learner.full_weights()
        announced = publisher.publish(1, weights) if rank == 0 else None
        served = announced.manifest["total"] if announced is not None else 0
        del weights
    seconds = time.perf_counter() - started
    peak = _rss_kib("VmHWM") - before
    out.put((rank, peak, served, seconds, announced))
    done.wait(600)
    publisher.close()
    if gang is not None:
        gang.close()


def _receive(announced) -> float:
    """Seconds from the plan to the version held whole by a generator's receiver."""
    from asyncrl.transport.weights import Received, WeightReceiver, WeightsPlan
    from asyncrl.transport.weights.parts import part_count
    from asyncrl.transport.weights.parts_receiver import PartsReceiver
    from asyncrl.transport.weights.ucx import UcxReceiver

    parts = part_count(announced.manifest)
    receiver: WeightReceiver = (
        PartsReceiver([UcxReceiver(relay=False) for _ in range(parts)])
        if parts > 1
        else UcxReceiver(relay=False)
    )
    try:
        started = time.perf_counter()
        receiver.want(WeightsPlan(1, announced.manifest, "train-0", announced.address))
        while (got := receiver.poll()) is None:
            time.sleep(0.001)
        if not isinstance(got, Received):
            raise SystemExit(f"the version was not received: {got}")
        return time.perf_counter() - started
    finally:
        receiver.close()


def _once(size: int, shape: dict, parts: bool) -> tuple[float, list[int], float, float]:
    context = multiprocessing.get_context("spawn")
    out, done = context.Queue(), context.Event()
    ranks = start_ranks(_rank, size, size, free_port(), shape, parts, out, done)
    try:
        said = sorted(out.get(timeout=1800) for _ in ranks)
        held_s = _receive(said[0][4])
    finally:
        done.set()
    for process in ranks:
        process.join(120)
        if process.exitcode != 0:
            raise SystemExit(f"a rank of the {size}-rank group failed ({process.exitcode})")
    busiest = max(peak for _, peak, _, _, _ in said) / 1024
    return busiest, [served for _, _, served, _, _ in said], max(s[3] for s in said), held_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    shape = llama_shape(args.layers, args.hidden, args.vocab)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 20))  # as train_memory's
    sizes = [int(n) for n in args.ranks.split(",")]
    print(f"publish_parts: {os.cpu_count()} CPUs; medians of {args.runs} fresh groups each")
    print(
        f"{'ranks':>5} {'publishing':>14} {'busiest rank MiB':>17} {'served per rank MiB':>24} "
        f"{'publish s':>10} {'held s':>7}"
    )
    for size in sizes:
        for parts in [False] if size == 1 else [False, True]:
            runs = [_once(size, shape, parts) for _ in range(args.runs)]
            busiest = statistics.median(r[0] for r in runs)
            served = "/".join(f"{s / MiB:.0f}" for s in runs[0][1])
            publish_s = statistics.median(r[2] for r in runs)
            held_s = statistics.median(r[3] for r in runs)
            how = "every rank" if parts else "rank 0"
            print(
                f"{size:>5} {how:>14} {busiest:>17.0f} {served:>24} {publish_s:>10.3f} "
                f"{held_s:>7.3f}"
            )


if __name__ == "__main__":
    main()
