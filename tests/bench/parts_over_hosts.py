"""A version's time to be held by a generator on another host: published whole from one
trainer host, or in parts from 2 and 4 (each host its rank's rows), each host's link held
to a rate.

    sudo python -m tests.bench.parts_over_hosts [--mib 418] [--rate 1gbit] [--ranks 2,4]
        [--runs 3]

Hosts of this machine (tests/support/hosts.py): h1..h4 are the trainer's ranks' hosts, h5
the generator's. Each trainer host serves its part of a model-like state of ``--mib`` MiB
(every tensor's rows split as FSDP2 splits them) with a UCX publisher of its own, as a
run across machines has it (the run's key: requests and buckets carry MACs); the receiver
on h5 takes the version as a generator does (every part at once, then whole tensors) and
is timed from the plan to the version held whole. Published whole, h1 serves all of it.

Two cases for the generator's link:

- *same*: every host's link, the generator's too, held to ``--rate`` both ways (NICs of
  one speed): the generator's own link bounds the time, however many hosts send;
- *faster*: only the trainer hosts' links held, the generator's not (a generator with a
  faster link, or trainer links busy with the group's own traffic, which this does not
  model): each part comes over its own host's link, at once.

Printed per case (medians of ``--runs``): the time to hold, and the bytes the busiest
trainer host sent (its ``eth0`` counters). Needs root (namespaces); the hosts share this
machine's cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgpack

from tests.support.hosts import Hosts, why_no_hosts

MiB = 1 << 20
TRAINERS = ["h1", "h2", "h3", "h4"]
GENERATOR = "h5"


def _state(mib: float) -> dict:
    from tests.support.weight_nodes import model_state

    return model_state(1, mib)


def _part(state: dict, rank: int, parts: int) -> dict:
    """Rank ``rank``'s rows of every tensor, as FSDP2 splits them (torch.chunk)."""
    import torch

    out = {}
    for name, tensor in state.items():
        chunks = torch.chunk(tensor, parts) if tensor.dim() else [tensor]
        if rank < len(chunks):
            out[name] = chunks[rank].clone()
    return out


def serve(directory: Path, rank: int, parts: int, mib: float) -> None:
    """A trainer host's side: publish this rank's part, announce it, serve until done."""
    from asyncrl.transport.weights.ucx import UcxPublisher
    from tests.support.weight_host_node import across_machines

    publisher = UcxPublisher(access=across_machines())
    state = _state(mib)
    announced = publisher.publish(1, _part(state, rank, parts) if parts > 1 else state)
    path = directory / f"part-{rank}.msgpack"
    path.with_suffix(".tmp").write_bytes(
        msgpack.packb([announced.version, announced.manifest, announced.address])
    )
    path.with_suffix(".tmp").rename(path)
    while not (directory / "done").exists():
        time.sleep(0.05)
    publisher.close()


def receive(directory: Path, parts: int, mib: float) -> None:
    """The generator's side: take the version as a generator does, timed."""
    from asyncrl.transport.weights import Announcement, Received, WeightsPlan
    from asyncrl.transport.weights.parts import compose
    from asyncrl.transport.weights.parts_receiver import PartsReceiver
    from asyncrl.transport.weights.ucx import UcxReceiver
    from tests.support.weight_host_node import across_machines

    shapes = {name: tuple(t.shape) for name, t in _state(mib).items()}
    paths = [directory / f"part-{rank}.msgpack" for rank in range(parts)]
    while not all(path.exists() for path in paths):
        time.sleep(0.05)
    said = [Announcement(*msgpack.unpackb(path.read_bytes())) for path in paths]
    announced = compose(1, said, shapes) if parts > 1 else said[0]
    plan = WeightsPlan(1, announced.manifest, "train-0", announced.address)
    access = across_machines()
    receiver = (
        PartsReceiver([UcxReceiver(relay=False, access=access) for _ in range(parts)])
        if parts > 1
        else UcxReceiver(relay=False, access=access)
    )
    try:
        started = time.perf_counter()
        receiver.want(plan)
        while (got := receiver.poll()) is None:
            time.sleep(0.001)
        held_s = time.perf_counter() - started
        if not isinstance(got, Received):
            raise SystemExit(f"the version was not received: {got}")
        (directory / "result.json").write_text(json.dumps({"held_s": held_s}))
    finally:
        receiver.close()
        (directory / "done").write_text("")


def _once(hosts: Hosts, work: Path, parts: int, mib: float, rate: str, same: bool) -> tuple:
    directory = Path(tempfile.mkdtemp(dir=work))
    used = TRAINERS[:parts]
    for name in [*TRAINERS, GENERATOR]:
        hosts.clear_limit(name)
    for name in used:
        hosts.limit_rate(name, rate)
    if same:
        hosts.limit_rate(GENERATOR, rate)
    before = {name: hosts.counters(name).sent for name in used}
    me = [sys.executable, "-m", "tests.bench.parts_over_hosts"]
    # A publisher whose receiver has gone logs UCX's connection reset at its close: the
    # end of every run here, not an error.
    quiet = {"UCX_LOG_LEVEL": "fatal"}
    servers = [
        hosts.start(
            name, [*me, "serve", str(directory), str(rank), str(parts), str(mib)], env=quiet
        )
        for rank, name in enumerate(used)
    ]
    hosts.run(GENERATOR, [*me, "receive", str(directory), str(parts), str(mib)], timeout=600)
    for server in servers:
        server.wait(60)
    held_s = json.loads((directory / "result.json").read_text())["held_s"]
    busiest = max(hosts.counters(name).sent - before[name] for name in used)
    return held_s, busiest


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("serve", "receive"):
        command, directory, *rest = sys.argv[1:]
        if command == "serve":
            serve(Path(directory), int(rest[0]), int(rest[1]), float(rest[2]))
        else:
            receive(Path(directory), int(rest[0]), float(rest[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=418)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    reason = why_no_hosts()
    if reason is not None:
        raise SystemExit(f"no hosts here: {reason}")
    sizes = [1, *(int(n) for n in args.ranks.split(","))]
    print(
        f"parts_over_hosts: {args.mib:g} MiB, links held to {args.rate}; medians of "
        f"{args.runs} runs"
    )
    print(f"{'generator link':>15} {'trainer hosts':>14} {'held s':>8} {'busiest host MiB':>17}")
    with tempfile.TemporaryDirectory() as work, Hosts(5, shared=[Path(work)]) as hosts:
        for same in (True, False):
            for parts in sizes:
                runs = [
                    _once(hosts, Path(work), parts, args.mib, args.rate, same)
                    for _ in range(args.runs)
                ]
                held = statistics.median(r[0] for r in runs)
                spread = f"{min(r[0] for r in runs):.2f}-{max(r[0] for r in runs):.2f}"
                busiest = statistics.median(r[1] for r in runs) / MiB
                link = "same" if same else "faster"
                print(
                    f"{link:>15} {parts:>14} {held:>8.2f} {busiest:>17.0f}  (held {spread} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
