"""Small-message round trips through the scheduler, beside a Ray actor queue, in one run.

    python -m tests.bench.bus_roundtrip [--rounds 3000] [--warmup 300] [--blocks 6]
                                        [--spins | --curve]

One round is what a worker does for each item: claim → lease → complete → ack, two
requests. Ours runs through the real scheduler process (journal on, replies to completions
held until the journal has them) and the real worker link, over ipc:// and tcp://127.0.0.1.
The Ray side is the pattern verl's fully-async trainer uses for its rollout queue: one Ray
actor holding the items, a client calling ``claim`` then ``complete`` on it and waiting for
each. Both carry the same payload (16 int32 token ids). Prints rounds per second, p50 and
p99 of a round, and our rate over Ray's. Ours runs with the default busy polling
(``scheduler.busy_poll_us``, ``scheduler.worker_busy_poll_us``) and once more without it.
The four take turns in blocks of rounds, so that the machine's bursts of noise fall on
each alike (Ray is started for each of its blocks, so its daemons never run beside ours);
the ratio is also printed block by block. ``--spins`` instead runs our scheduler four
ways, with the scheduler's and the worker's busy polling each on or off; ``--curve`` runs
it over tcp://127.0.0.1 with CurveZMQ (the default on every TCP endpoint) and without.
Needs ``ray`` (``pip install -e '.[bench]'``), but for ``--spins`` and ``--curve``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import numpy as np
import zmq

from asyncrl.runtime.contract.config import config_from_dict, dump_config, load_config
from asyncrl.transport import protocol as p
from asyncrl.transport.sockets import busy_poll
from asyncrl.transport.zmq_link import ZmqLink
from tests.support.runlink import run_link

TOKENS = np.arange(16, dtype=np.int32)
IPC_ROW = "asyncrl scheduler, ipc"
RAY_ROW = "Ray actor queue"
ECHO_ROW = "echo through our link, ipc"
BARE_ROW = "echo, bare pyzmq, ipc"


Spins = tuple[int, int]  # (scheduler.busy_poll_us, scheduler.worker_busy_poll_us)
NO_SPIN: Spins = (0, 0)
# Who polls without sleeping: the four ways, for --spins.
SPIN_SETTINGS: dict[str, Spins] = {
    "scheduler 200 us, worker 1 ms": (200, 1000),
    "scheduler 200 us, worker none": (200, 0),
    "scheduler none, worker 1 ms": (0, 1000),
    "neither": NO_SPIN,
}


def scheduler_config(run_dir: Path, spins: Spins | None = None, curve: str = "auto") -> dict:
    """The benchmark's scheduler config; ``spins`` None: the config's default busy polling."""
    busy = {} if spins is None else {"busy_poll_us": spins[0], "worker_busy_poll_us": spins[1]}
    busy["curve"] = curve
    return {
        "run": {"dir": str(run_dir), "total_steps": 1_000_000},
        # No step ever runs here, so admission must not wait for one.
        "pipeline": {"max_staleness": 10_000_000, "train_batch_groups": 1},
        # The benchmark's worker never heartbeats: on a loaded machine a run can outlast
        # the default timeout, and a worker declared dead would end the benchmark.
        "scheduler": {"worker_timeout_s": 3600, **busy},
        "logging": {"level": "warning"},
    }


def start_scheduler(
    run_dir: Path, control: str, events: str, spins: Spins | None = None, curve: str = "auto"
) -> subprocess.Popen[bytes]:
    cfg_path = run_dir.parent / f"{run_dir.name}.yaml"
    cfg_path.write_text(dump_config(config_from_dict(scheduler_config(run_dir, spins, curve))))
    serve = [sys.executable, "-m", __spec__.name, "--serve", str(cfg_path), control, events]
    proc = subprocess.Popen(serve, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (run_dir / "endpoints.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the scheduler did not start")
        time.sleep(0.05)
    return proc


def time_rounds(one_round: Callable[[], None], rounds: int) -> list[float]:
    took = []
    for _ in range(rounds):
        start = time.perf_counter()
        one_round()
        took.append(time.perf_counter() - start)
    return took


@contextmanager
def scheduler_rounds(
    kind: str, total: int, root: Path, spins: Spins | None = None, curve: str = "auto"
) -> Iterator[Callable[[], None]]:
    """One round through a real scheduler process (``total`` items loaded), while open."""
    setting = "default" if spins is None else f"{spins[0]}-{spins[1]}"
    run_dir = root / f"{kind}-{setting}-{curve}"
    if kind == "ipc":
        control, events = f"ipc://{run_dir}-control.sock", f"ipc://{run_dir}-events.sock"
    else:
        control, events = "tcp://127.0.0.1:0", "tcp://127.0.0.1:0"
    proc = start_scheduler(run_dir, control, events, spins, curve)
    cfg = config_from_dict(scheduler_config(run_dir, spins))
    busy_poll_s = cfg.scheduler.worker_busy_poll_us / 1e6
    # A worker speaks only for itself: one connection each, as in a run.
    loader = run_link(run_dir, "loader", "dataloader")
    link = run_link(run_dir, "gen", "generate", busy_poll_s=busy_poll_s)
    try:
        for each, worker, role in ((loader, "loader", "dataloader"), (link, "gen", "generate")):
            assert isinstance(
                each.request(p.Hello(worker, role, p.PROTOCOL_VERSION, 0), 10), p.Ready
            )
        link.request(p.LoadedVersion("gen", 0), 10)
        for start in range(0, total, 500):
            keys = range(start, min(total, start + 500))
            groups = tuple(p.NewGroup(f"k{i}", {"x": i}) for i in keys)
            loader.request(p.AddGroups("loader", groups), 30)

        def one_round() -> None:
            lease = link.request(p.Claim("gen", "generate", 1), 10)
            assert isinstance(lease, p.Lease), lease
            result = p.Result(lease.items[0].gid, {"tokens": TOKENS}, (0, 0))
            ack = link.request(p.Complete("gen", lease.lease_id, lease.fence, (result,)), 10)
            assert isinstance(ack, p.Ack), ack

        yield one_round
    finally:
        link.request(p.Stop("benchmark done"), 10)
        link.close()
        loader.close()
        proc.wait(30)


def serve_echo(control: str, busy_poll_us: int) -> None:
    """The transport alone: a ROUTER bound like the scheduler's, sending each request back
    as its own reply, polled as the scheduler's loop polls, doing no other work."""
    from asyncrl.transport.sockets import bind_scheduler_sockets_at, recv_waiting

    ctx = zmq.Context()
    sockets = bind_scheduler_sockets_at(ctx, control, "inproc://unused", max_message_bytes=2**20)
    router = sockets.control
    watched = [(router, zmq.POLLIN)]
    spin, served = busy_poll_us / 1e6, False
    print("ready", flush=True)
    while True:
        ready = busy_poll(watched, spin if served else 0.0) or zmq.zmq_poll(watched, 1000)
        served = bool(ready)
        while (frames := recv_waiting(router)) is not None:
            if frames[1].bytes == b"stop":
                return
            router.send_multipart(frames, copy=False)


@contextmanager
def echo_rounds(root: Path, through_link: bool) -> Iterator[Callable[[], None]]:
    """One round of the same two requests to an echo of the transport alone (serve_echo):
    through our worker link (encoding and decoding as ours do), or as bare pyzmq calls on
    a DEALER with the frames encoded once. What a scheduler doing no work would cost."""
    cfg = config_from_dict(scheduler_config(root / "echo"))
    control = f"ipc://{root}/echo-{'link' if through_link else 'bare'}.sock"
    serve = [sys.executable, "-m", __spec__.name, "--echo", control,
             str(cfg.scheduler.busy_poll_us)]  # fmt: skip
    proc = subprocess.Popen(serve, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    spin = cfg.scheduler.worker_busy_poll_us / 1e6
    claim = p.Claim("gen", "generate", 1)
    done = p.Complete("gen", 1, 1, (p.Result(0, {"tokens": TOKENS}, (0, 0)),))
    with ExitStack() as closing:
        if through_link:
            link = ZmqLink(control, "inproc://unused", identity="bench-echo", busy_poll_s=spin)
            closing.callback(link.close)

            def one_round() -> None:
                assert isinstance(link.request(claim, 10), p.Claim)
                assert isinstance(link.request(done, 10), p.Complete)

        else:
            ctx = closing.enter_context(zmq.Context())
            dealer = closing.enter_context(ctx.socket(zmq.DEALER))
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(control)
            polled = [(dealer, zmq.POLLIN)]
            requests = [[bytes(f) for f in p.encode(m, 1)] for m in (claim, done)]

            def one_round() -> None:
                for frames in requests:
                    dealer.send_multipart(frames)
                    busy_poll(polled, spin) or zmq.zmq_poll(polled, 10_000)
                    dealer.recv_multipart(copy=False)

        try:
            yield one_round
        finally:
            with zmq.Context() as ctx, ctx.socket(zmq.DEALER) as stop:
                stop.connect(control)
                stop.send_multipart([b"stop"])
                proc.wait(30)
                stop.setsockopt(zmq.LINGER, 0)


@contextmanager
def ray_rounds(total: int) -> Iterator[Callable[[], None]]:
    """One round through a Ray actor holding ``total`` items, while open."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="error")

    @ray.remote
    class WorkQueue:
        def __init__(self, count: int) -> None:
            self.items = [(i, {"x": i}) for i in range(count)]
            self.done: dict[int, dict] = {}

        def claim(self) -> tuple[int, dict]:
            return self.items.pop()

        def complete(self, item: int, result: dict) -> int:
            self.done[item] = result
            return len(self.done)

    queue = WorkQueue.remote(total)

    def one_round() -> None:
        item, _payload = ray.get(queue.claim.remote())
        ray.get(queue.complete.remote(item, {"tokens": TOKENS}))

    try:
        yield one_round
    finally:
        ray.shutdown()


def summary(took: list[float]) -> tuple[float, float, float]:
    cuts = statistics.quantiles(took, n=100)
    return len(took) / sum(took), cuts[49] * 1e3, cuts[98] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument(
        "--spins",
        action="store_true",
        help="instead: the scheduler's and the worker's busy polling on and off, four ways",
    )
    parser.add_argument(
        "--curve", action="store_true", help="instead: loopback TCP with CurveZMQ and without"
    )
    parser.add_argument("--serve", nargs=3, metavar=("CONFIG", "CONTROL", "EVENTS"))
    parser.add_argument("--echo", nargs=2, metavar=("CONTROL", "BUSY_POLL_US"))
    args = parser.parse_args()
    if args.echo:
        return serve_echo(args.echo[0], int(args.echo[1]))
    if args.serve:
        from asyncrl.runtime.contract.logs import configure_logging
        from asyncrl.runtime.scheduler.service.process import serve

        configure_logging(process="scheduler", level="warning")
        raise SystemExit(serve(load_config(Path(args.serve[0])), resume=False,
                               endpoints=(args.serve[1], args.serve[2])))  # fmt: skip
    block = max(1, args.rounds // args.blocks)
    if args.spins:
        return compare_spins(args.warmup, block, args.blocks)
    if args.curve:
        return compare_curve(args.warmup, block, args.blocks)
    print(
        f"{block * args.blocks} rounds each (claim → lease → complete → ack) after "
        f"{args.warmup} warm-up, in {args.blocks} blocks taken in turn, {os.cpu_count()} cores"
    )
    total = args.warmup + block * args.blocks
    took: dict[str, list[float]]
    per_block: list[dict[str, float]] = []  # each contender's rounds/s, block by block
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp, ExitStack() as stack:
        # The blocks alternate, so that a burst of noise on the machine falls on each
        # contender alike rather than on whichever ran then. Our schedulers stay up (idle,
        # they sleep); Ray is started for each of its blocks, so that its daemons are not
        # running beside ours.
        contenders = {
            IPC_ROW: scheduler_rounds("ipc", total, Path(tmp)),
            "asyncrl scheduler, tcp": scheduler_rounds("tcp", total, Path(tmp)),
            # What busy polling buys (and the figure before it was the default).
            "asyncrl, ipc, no busy poll": scheduler_rounds("ipc", total, Path(tmp), NO_SPIN),
            # The floors: the same requests answered by a bare echo, through our link,
            # and as bare pyzmq calls.
            ECHO_ROW: echo_rounds(Path(tmp), through_link=True),
            BARE_ROW: echo_rounds(Path(tmp), through_link=False),
        }
        rounds = {name: stack.enter_context(made) for name, made in contenders.items()}
        for one_round in rounds.values():
            time_rounds(one_round, args.warmup)
        took = {name: [] for name in [*rounds, RAY_ROW]}
        for _ in range(args.blocks):
            rates = {}
            for name, one_round in rounds.items():
                took[name] += (block_took := time_rounds(one_round, block))
                rates[name] = len(block_took) / sum(block_took)
            with ray_rounds(args.warmup + block) as one_round:
                time_rounds(one_round, args.warmup)
                took[RAY_ROW] += (block_took := time_rounds(one_round, block))
            rates[RAY_ROW] = len(block_took) / sum(block_took)
            per_block.append(rates)
    report(took, per_block)


def compare_spins(warmup: int, block: int, blocks: int) -> None:
    """Who should poll without sleeping: our scheduler over ipc with the scheduler's and
    the worker's busy polling each on (the defaults before and now) or off, taking turns
    in blocks as the main comparison does."""
    contenders = {
        name: functools.partial(scheduler_rounds, "ipc", spins=spins)
        for name, spins in SPIN_SETTINGS.items()
    }
    compare_in_turn("over ipc", contenders, warmup, block, blocks)


def compare_curve(warmup: int, block: int, blocks: int) -> None:
    """What CurveZMQ costs a round over loopback TCP."""
    contenders = {
        f"tcp, curve {curve}": functools.partial(scheduler_rounds, "tcp", curve=curve)
        for curve in ("on", "off")
    }
    compare_in_turn("over tcp://127.0.0.1", contenders, warmup, block, blocks)


def compare_in_turn(
    where: str,
    contenders: dict[str, Callable[[int, Path], AbstractContextManager[Callable[[], None]]]],
    warmup: int,
    block: int,
    blocks: int,
) -> None:
    """Each contender's schedulers, taking turns in blocks as the main comparison does."""
    print(f"{block * blocks} rounds each {where} after {warmup} warm-up, in {blocks} blocks "
          f"taken in turn, {os.cpu_count()} cores")  # fmt: skip
    total = warmup + block * blocks
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp, ExitStack() as stack:
        rounds = {
            name: stack.enter_context(made(total, Path(tmp))) for name, made in contenders.items()
        }
        for one_round in rounds.values():
            time_rounds(one_round, warmup)
        took: dict[str, list[float]] = {name: [] for name in rounds}
        rates: dict[str, list[float]] = {name: [] for name in rounds}
        for _ in range(blocks):
            for name, one_round in rounds.items():
                took[name] += (block_took := time_rounds(one_round, block))
                rates[name].append(len(block_took) / sum(block_took))
    print(f"{'':32} {'median block':>12} {'p50 ms':>8} {'p99 ms':>8}")
    for name in rounds:
        _, p50, p99 = summary(took[name])
        print(f"{name:32} {statistics.median(rates[name]):12.0f} {p50:8.3f} {p99:8.3f}")


def report(took: dict[str, list[float]], per_block: list[dict[str, float]]) -> None:
    print(f"{'':28} {'rounds/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    results = {name: summary(times) for name, times in took.items()}
    for name, (rate, p50, p99) in results.items():
        print(f"{name:28} {rate:10.0f} {p50:8.3f} {p99:8.3f}")
    ray_rate = results[RAY_ROW][0]
    for kind in ("ipc", "tcp"):
        rate = results[f"asyncrl scheduler, {kind}"][0]
        print(f"ratio asyncrl {kind} / Ray: {rate / ray_rate:.1f}x")
    ipc_rate, echo_rate, bare_rate = (results[row][0] for row in (IPC_ROW, ECHO_ROW, BARE_ROW))
    # A scheduler that did no work at all would run at the echo's rate: the most any
    # scheduler could reach behind our link, or behind pyzmq itself.
    print(
        f"ratio echo / Ray: {echo_rate / ray_rate:.1f}x through our link, "
        f"{bare_rate / ray_rate:.1f}x bare; asyncrl ipc runs at {ipc_rate / echo_rate:.0%} "
        f"and {ipc_rate / bare_rate:.0%} of their rates"
    )
    ratios = [rates[IPC_ROW] / rates[RAY_ROW] for rates in per_block]
    spread = ", ".join(f"{r:.1f}" for r in ratios)
    print(f"ipc / Ray block by block: {spread} (median {statistics.median(ratios):.1f}x)")
    # This machine's noise alone can put a bare echo's p99 above 2 ms, so the tail is
    # judged against the bare echo's, measured in the same run.
    ipc_p99, bare_p99 = results[IPC_ROW][2], results[BARE_ROW][2]
    print(f"p99 asyncrl ipc / bare pyzmq echo: {ipc_p99 / bare_p99:.2f}x ({ipc_p99:.3f} ms "
          f"against {bare_p99:.3f} ms)")  # fmt: skip
    # Block by block, so that a burst of noise shows as the block it fell in.
    names = list(per_block[0])
    print("rounds/s block by block: " + ", ".join(f"{i + 1}: {n}" for i, n in enumerate(names)))
    for number, rates in enumerate(per_block, 1):
        print(f"  block {number}: " + " ".join(f"{rates[n]:6.0f}" for n in names))


if __name__ == "__main__":
    main()
