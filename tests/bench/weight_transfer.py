"""Moving a policy's weights from one trainer process to 1, 2 and 4 generator processes.

    python -m tests.bench.weight_transfer [--gib 1.0] [--receivers 1,2,4] [--repeats 3]
        [--methods gloo,zmq] [--quick]

The state dict is laid out in one flat uint8 buffer of ``--gib`` GiB, as a weight plane
packs it, so every method moves the same contiguous bytes (random, so a misplaced chunk
changes the checksum); the cost of packing and unpacking tensors is not measured here.

Each method runs in real processes (multiprocessing, spawn): one sender ("trainer") and
N receivers ("generators"), each receiver with its own pre-faulted destination buffer.
A repeat starts when every process has passed a barrier; its time runs from the sender's
start to the last receiver's finish, both read from ``time.monotonic()`` (CLOCK_MONOTONIC,
one clock for every process on Linux). Two warm-up repeats (a weight plane fills both of
its buffers once), then ``--repeats`` timed ones;
the last is checked: each receiver's buffer is zeroed before it and its CRC-32 must equal
the sender's, or the benchmark fails.

Printed, for each method and receiver count: the median seconds (and the fastest and
slowest repeat), GB/s (1e9 bytes per receiver per second), the ratio of that to the
memcpy limit, the time relative to the same method's 1-receiver time, and how many times
faster than the ``gloo`` broadcast to as many receivers (when gloo ran).

- ``memcpy``: one process copies the bytes into a pre-faulted buffer with one core
  (``numpy.copyto``): the limit for any transfer on this host.
- ``gloo``: ``torch.distributed.broadcast`` of the flat buffer as one uint8 tensor on the
  gloo backend, rank 0 to ranks 1..N (world N+1), over TCP on 127.0.0.1.
- ``gloo-64mib``: the same, as a sequence of 64 MiB broadcasts (how bucketed weight sync
  does it, so a receiver can load bucket k while bucket k+1 is in flight).
- ``zmq``: one PUSH socket per receiver over ipc://, the buffer sent in 64 MiB messages
  with ``copy=False`` (no copy on the sender), interleaved across receivers; each PULL
  receiver ``recv_into`` its buffer at the right offset (libzmq copies each message once).
- ``ucx``, ``ucx-direct``, ``ucx-chain``, ``ucx-polling``: asyncrl's UCX strategy (relay
  tree of fan-out 2, every receiver from the sender, a chain, busy-polling progress); the
  time includes staging and checksumming at the sender and checking at every receiver.
- ``shm``: asyncrl's shared-memory strategy: the sender stages into a file in /dev/shm,
  each receiver maps it read-only and checks every bucket (no copy per receiver).
- ``ucx-map``: the default (``ucx`` with ``weights.map_on_host``): the UCX sender stages
  into slot files, and receivers on its host map them as ``shm`` does.

Adding a method: subclass ``Method``, fill in its sender and receiver hooks, decorate it
with ``@register``; it runs with the others under ``--methods``. How much of the time a
generator is blocked while its weights arrive is measured apart, by
``python -m tests.bench.weight_stall``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import queue
import socket
import statistics
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

GIB = 1 << 30
MIB = 1 << 20
BUCKET = 64 * MIB
BARRIER_TIMEOUT_S = 600.0
POLL_S = 0.0005  # how often a receiver looks for its plan: often, without taking a core
WARMUPS = 2  # a dual-buffered sender allocates its second buffer on the second repeat


@dataclass(frozen=True)
class Setting:
    """What every process of one method's run knows: who it is and who the others are."""

    rank: int  # 0 is the sender; receivers are 1..receivers
    receivers: int
    nbytes: int
    workdir: str  # a private directory for ipc:// endpoints and the like
    port: int  # a free TCP port on 127.0.0.1, for a method that needs a rendezvous


class Method:
    """One way of moving the bytes. One instance per process; ``Setting.rank`` says which side.

    The harness calls, in the sender: ``setup_sender``, then ``send`` once per repeat,
    then ``teardown``; in each receiver: ``setup_receiver``, ``receive`` once per repeat,
    ``teardown``. ``send`` may return before the bytes have arrived (the time is taken at
    the receivers); ``receive`` returns only when all of ``dst`` holds them. Setup is
    not timed; a connection that only forms lazily should be formed there.
    """

    name: ClassVar[str]

    def __init__(self, setting: Setting) -> None:
        self.setting = setting

    def setup_sender(self, src: np.ndarray) -> None:
        pass

    def send(self, src: np.ndarray) -> None:
        raise NotImplementedError

    def setup_receiver(self, dst: np.ndarray) -> None:
        pass

    def receive(self, dst: np.ndarray) -> None:
        raise NotImplementedError

    def wait_sent(self) -> float:
        """When the sender no longer needs the source bytes (after ``send``)."""
        return time.monotonic()

    def teardown(self) -> None:
        pass


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


def buckets(nbytes: int, size: int) -> list[slice]:
    return [slice(start, min(nbytes, start + size)) for start in range(0, nbytes, size)]


@register
class Gloo(Method):
    """torch.distributed broadcast on gloo; ``bucket`` bytes per call (0: one call)."""

    name = "gloo"
    bucket = 0

    def _init(self) -> None:
        import torch.distributed as dist

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{self.setting.port}",
            rank=self.setting.rank,
            world_size=self.setting.receivers + 1,
        )
        dist.barrier()  # every pair has connected before the first timed call

    def _broadcast(self, buf: np.ndarray) -> None:
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(buf)
        parts = buckets(buf.nbytes, self.bucket) if self.bucket else [slice(None)]
        for part in parts:
            dist.broadcast(tensor[part], src=0)

    def setup_sender(self, src: np.ndarray) -> None:
        self._init()

    def send(self, src: np.ndarray) -> None:
        self._broadcast(src)

    def setup_receiver(self, dst: np.ndarray) -> None:
        self._init()

    def receive(self, dst: np.ndarray) -> None:
        self._broadcast(dst)

    def teardown(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


@register
class GlooBucketed(Gloo):
    name = "gloo-64mib"
    bucket = BUCKET


@register
class Zmq(Method):
    """PUSH per receiver over ipc://, 64 MiB messages sent with copy=False, recv_into."""

    name = "zmq"

    def _endpoint(self, rank: int) -> str:
        return f"ipc://{self.setting.workdir}/zmq-{rank}.sock"

    def setup_sender(self, src: np.ndarray) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.socks = []
        for rank in range(1, self.setting.receivers + 1):
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(self._endpoint(rank))
            self.socks.append(sock)
        # A one-byte message per receiver: the connection exists before the first repeat.
        for sock in self.socks:
            sock.send(b"\0")

    def send(self, src: np.ndarray) -> None:
        view = memoryview(src)
        self.trackers = []
        for part in buckets(src.nbytes, BUCKET):
            for sock in self.socks:
                self.trackers.append(sock.send(view[part], copy=False, track=True))

    def wait_sent(self) -> float:
        # copy=False: libzmq reads the source until each message is out.
        for tracker in self.trackers:
            tracker.wait()
        return time.monotonic()

    def setup_receiver(self, dst: np.ndarray) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(self._endpoint(self.setting.rank))
        assert self.sock.recv() == b"\0"

    def receive(self, dst: np.ndarray) -> None:
        view = memoryview(dst)
        for part in buckets(dst.nbytes, BUCKET):
            got = self.sock.recv_into(view[part])
            if got != part.stop - part.start:
                raise RuntimeError(f"zmq: a {got}-byte message where {part} was expected")

    def teardown(self) -> None:
        self.ctx.destroy(linger=None)


class Plane(Method):
    """asyncrl's weight plane: publish (stage + CRC-32C per bucket), then receive.

    Receivers form the relay tree the scheduler would plan with ``fanout`` (0: every
    receiver pulls from the sender). The scheduler's part, handing each receiver its plan,
    is played through files in the run's private directory; the time includes staging the
    bytes into the sender's buffer, checksumming them, and checking them at every receiver.
    """

    fanout: ClassVar[int] = 0

    def make_publisher(self) -> Any:
        raise NotImplementedError

    def make_receiver(self) -> Any:
        raise NotImplementedError

    def _path(self, name: str) -> str:
        return os.path.join(self.setting.workdir, name)

    def _publish_file(self, name: str, data: bytes) -> None:
        staging = self._path(f".{name}.tmp")
        with open(staging, "wb") as f:
            f.write(data)
        os.replace(staging, self._path(name))

    def _read_file(self, name: str) -> bytes:
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while not os.path.exists(self._path(name)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} never appeared")
            time.sleep(POLL_S)
        with open(self._path(name), "rb") as f:
            return f.read()

    def setup_sender(self, src: np.ndarray) -> None:
        import torch

        self.publisher = self.make_publisher()
        self.state = {"flat": torch.from_numpy(src)}
        self.version = 0
        self._publish_file("addr-0", self.publisher.address)

    def send(self, src: np.ndarray) -> None:
        import msgpack

        self.version += 1
        announcement = self.publisher.publish(self.version, self.state)
        self.ready_at = time.monotonic()
        self._publish_file(f"manifest-{self.version}", msgpack.packb(announcement.manifest))

    def setup_receiver(self, dst: np.ndarray) -> None:
        self.receiver = self.make_receiver()
        self._publish_file(f"addr-{self.setting.rank}", self.receiver.address)
        rank, k = self.setting.rank, self.fanout
        self.parent = 0 if k == 0 else (rank - 1) // k
        self.version = 0
        self.received: np.ndarray | None = None

    def receive(self, dst: np.ndarray) -> None:
        import msgpack

        from asyncrl.transport.weights import Received, WeightsPlan

        self.version += 1
        manifest = msgpack.unpackb(self._read_file(f"manifest-{self.version}"))
        source = self._read_file(f"addr-{self.parent}")
        if self.parent:  # as the scheduler orders it: a relay is planned before its children
            self._read_file(f"wants-{self.version}-{self.parent}")
        self.receiver.want(WeightsPlan(self.version, manifest, f"rank-{self.parent}", source))
        self._publish_file(f"wants-{self.version}-{self.setting.rank}", b"")
        while (outcome := self.receiver.poll()) is None:
            time.sleep(POLL_S)
        if not isinstance(outcome, Received):
            raise RuntimeError(f"{self.name}: version {self.version} not received: {outcome}")
        self.receiver.loaded(outcome)
        self.received = outcome.state["flat"].numpy()

    def checked_bytes(self, dst: np.ndarray) -> np.ndarray:
        assert self.received is not None
        return self.received

    def teardown(self) -> None:
        side = getattr(self, "publisher", None) or getattr(self, "receiver", None)
        if side is not None:
            side.close()


class Ucx(Plane):
    """Over UCX: receivers pull checksummed buckets into their own buffers, and relay them."""

    progress: ClassVar[str] = "thread"

    def make_publisher(self) -> Any:
        from asyncrl.transport.weights.ucx import UcxPublisher

        return UcxPublisher(bucket_mb=64, progress_mode=self.progress)  # type: ignore[arg-type]

    def make_receiver(self) -> Any:
        from asyncrl.transport.weights.ucx import UcxReceiver

        return UcxReceiver(bucket_mb=64, progress_mode=self.progress)  # type: ignore[arg-type]


@register
class Shm(Plane):
    """Through shared memory: receivers map the sender's staged file and check it."""

    name = "shm"

    def make_publisher(self) -> Any:
        from pathlib import Path

        from asyncrl.runtime.contract.config import WeightsSection
        from asyncrl.runtime.contract.rundir import RunDir
        from asyncrl.transport.weights.shm import ShmPublisher

        shared = RunDir(Path(self.setting.workdir)).weight_dirs(WeightsSection()).shared
        return ShmPublisher(shared, bucket_mb=64)

    def make_receiver(self) -> Any:
        from asyncrl.transport.weights.shm import ShmReceiver

        return ShmReceiver()


@register
class UcxMapped(Plane):
    """The default path (ucx with weights.map_on_host): the sender stages into slot files,
    receivers on its host map them and check them once per host, as shm does."""

    name = "ucx-map"

    def _weights(self) -> Any:
        from asyncrl.runtime.contract.config import WeightsSection

        return WeightsSection(strategy="ucx", map_on_host=True)

    def make_publisher(self) -> Any:
        from pathlib import Path

        from asyncrl.runtime.contract.rundir import RunDir
        from asyncrl.transport.weights import make_publisher

        weights = self._weights()
        return make_publisher(weights, RunDir(Path(self.setting.workdir)).weight_dirs(weights))

    def make_receiver(self) -> Any:
        from pathlib import Path

        from asyncrl.runtime.contract.rundir import RunDir
        from asyncrl.transport.weights import make_receiver

        weights = self._weights()
        return make_receiver(weights, RunDir(Path(self.setting.workdir)).weight_dirs(weights))


@register
class UcxTree(Ucx):
    name = "ucx"
    fanout = 2


@register
class UcxDirect(Ucx):
    name = "ucx-direct"
    fanout = 0


@register
class UcxChain(Ucx):
    name = "ucx-chain"
    fanout = 1


@register
class UcxPolling(Ucx):
    name = "ucx-polling"
    fanout = 2
    progress = "polling"


# ---- the processes -------------------------------------------------------------------


def prefaulted(nbytes: int) -> np.ndarray:
    buf = np.empty(nbytes, dtype=np.uint8)
    buf.fill(0)  # touch every page now, not inside a timed repeat
    return buf


def source_bytes(nbytes: int) -> np.ndarray:
    return np.random.default_rng(20240613).integers(0, 256, size=nbytes, dtype=np.uint8)


def _sender_main(method: Method, rounds: int, barrier: Any, results: Any) -> None:
    src = source_bytes(method.setting.nbytes)
    results.put(("crc", 0, zlib.crc32(src)))
    method.setup_sender(src)
    for round_ in range(rounds):
        barrier.wait(BARRIER_TIMEOUT_S)
        start = time.monotonic()
        method.send(src)
        results.put(("start", round_, start))
        # A method that stages before anything moves says when the bytes were ready.
        results.put(("ready", round_, getattr(method, "ready_at", start)))
        # How long the trainer could not train: until send() returned, or, for a method
        # whose send only starts the transfer, until it has let go of the source bytes.
        results.put(("held", round_, method.wait_sent() - start))
    barrier.wait(BARRIER_TIMEOUT_S)  # every receiver is done before the sockets close
    method.teardown()


def _receiver_main(method: Method, rounds: int, barrier: Any, results: Any) -> None:
    dst = prefaulted(method.setting.nbytes)
    method.setup_receiver(dst)
    for round_ in range(rounds):
        checked = round_ == rounds - 1
        if checked:
            dst.fill(0)
        barrier.wait(BARRIER_TIMEOUT_S)
        # The generator-blocked-fraction measurement goes here: a stand-in decode loop on
        # this thread while the bytes arrive, its progress reported beside the finish.
        method.receive(dst)
        results.put(("finish", round_, time.monotonic()))
        if checked:
            got = getattr(method, "checked_bytes", lambda d: d)(dst)
            results.put(("crc", method.setting.rank, zlib.crc32(got)))
    barrier.wait(BARRIER_TIMEOUT_S)
    method.teardown()


def _process_main(name: str, setting: Setting, rounds: int, barrier: Any, results: Any) -> None:
    try:
        method = METHODS[name](setting)
        side = _sender_main if setting.rank == 0 else _receiver_main
        side(method, rounds, barrier, results)
    except BaseException:
        results.put(("error", setting.rank, traceback.format_exc()))
        barrier.abort()
        raise


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_method(
    name: str, receivers: int, nbytes: int, repeats: int
) -> tuple[list[float], list[float], list[float]]:
    """Seconds of each timed repeat, sender start to last receiver finish, and from the
    bytes being ready at the sender (after any staging) to the last finish; checks bytes."""
    ctx = mp.get_context("spawn")
    rounds = repeats + WARMUPS
    barrier = ctx.Barrier(receivers + 1)
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="asyncrl-wbench-") as workdir:
        port = free_port()
        settings = [
            Setting(rank, receivers, nbytes, workdir, port) for rank in range(receivers + 1)
        ]
        procs = [
            ctx.Process(
                target=_process_main,
                args=(name, setting, rounds, barrier, results),
                name=f"{name}-{setting.rank}",
            )
            for setting in settings
        ]
        for proc in procs:
            proc.start()
        try:
            got = collect(results, procs, expected=rounds * (receivers + 3) + receivers + 1)
        finally:
            for proc in procs:
                proc.join(30)
                if proc.is_alive():
                    proc.terminate()
                    proc.join()
    failed = [p.name for p in procs if p.exitcode != 0]
    if failed:
        raise SystemExit(f"{name}, {receivers} receivers: {failed} exited with an error")
    crcs = {rank: crc for kind, rank, crc in got if kind == "crc"}
    wrong = [rank for rank in range(1, receivers + 1) if crcs.get(rank) != crcs[0]]
    if wrong:
        raise SystemExit(f"{name}, {receivers} receivers: wrong bytes at receivers {wrong}")
    starts = {r: t for kind, r, t in got if kind == "start"}
    ready = {r: t for kind, r, t in got if kind == "ready"}
    finishes: dict[int, list[float]] = {}
    for kind, round_, t in got:
        if kind == "finish":
            finishes.setdefault(round_, []).append(t)
    held = {r: t for kind, r, t in got if kind == "held"}
    timed = range(WARMUPS, rounds)
    whole = [max(finishes[r]) - starts[r] for r in timed]
    moving = [max(finishes[r]) - ready[r] for r in timed]
    return whole, moving, [held[r] for r in timed]


def collect(results: Any, procs: list[Any], expected: int) -> list[tuple[str, int, Any]]:
    got: list[tuple[str, int, Any]] = []
    while len(got) < expected:
        try:
            item = results.get(timeout=1.0)
        except queue.Empty:
            dead = [p.name for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise SystemExit(f"{dead} died without a report") from None
            continue
        if item[0] == "error":
            raise SystemExit(f"rank {item[1]} failed:\n{item[2]}")
        got.append(item)
    return got


def memcpy_seconds(nbytes: int, repeats: int) -> list[float]:
    src = source_bytes(nbytes)
    dst = prefaulted(nbytes)
    took = []
    for round_ in range(repeats + 1):
        if round_ == repeats:
            dst.fill(0)  # the checked copy cannot pass on an earlier one's bytes
        start = time.monotonic()
        np.copyto(dst, src)
        took.append(time.monotonic() - start)
    if zlib.crc32(dst) != zlib.crc32(src):
        raise SystemExit("memcpy: wrong bytes")
    return took[1:]


# ---- the report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    method: str
    receivers: int  # 0 for memcpy, which has none
    took: list[float]  # sender start to last receiver finish
    moving: list[float]  # bytes ready at the sender (staged) to last receiver finish
    held: list[float]  # the sender's training thread held up


def machine_facts() -> str:
    import torch
    import zmq

    model = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if "model name" in ln), "")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return (
        f"{os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable) {model}, "
        f"{mem:.0f} GiB memory; Python {platform.python_version()}, torch {torch.__version__}, "
        f"numpy {np.__version__}, pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()})"
    )


def table(rows: list[Row], nbytes: int, limit_gbs: float) -> str:
    head = (
        f"{'method':12} {'receivers':>9} {'seconds':>8} {'(min-max)':>15} "
        f"{'GB/s':>6} {'x memcpy':>8} {'x 1-recv':>8} {'gloo / this':>11} "
        f"{'trainer held s':>14} {'staged->done s':>14} {'GB/s':>6}"
    )
    lines = [head]
    one: dict[str, float] = {}
    # How many times faster than the gloo broadcast to as many receivers, in this run.
    gloo = {r.receivers: statistics.median(r.took) for r in rows if r.method == "gloo"}
    for row in rows:
        med = statistics.median(row.took)
        if row.receivers == 1:
            one[row.method] = med
        gbs = nbytes / med / 1e9
        rel = f"{med / one[row.method]:8.2f}" if row.method in one else f"{'-':>8}"
        count = f"{row.receivers:9d}" if row.receivers else f"{'-':>9}"
        spread = f"({min(row.took):.3f}-{max(row.took):.3f})"
        moving = statistics.median(row.moving)
        staged = f"{moving:14.3f} {nbytes / moving / 1e9:6.2f}" if moving < med else ""
        held = f"{statistics.median(row.held):14.3f}" if row.receivers else f"{'-':>14}"
        versus = f"{gloo[row.receivers] / med:11.2f}" if row.receivers in gloo else f"{'-':>11}"
        lines.append(
            f"{row.method:12} {count} {med:8.3f} {spread:>15} "
            f"{gbs:6.2f} {gbs / limit_gbs:8.2f} {rel} {versus} {held} {staged}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--receivers", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument(
        "--turns",
        type=int,
        default=1,
        help="run every method this many times, taking turns, and pool their repeats",
    )
    parser.add_argument("--quick", action="store_true", help="64 MiB, receivers 1,2, 1 repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.gib, args.receivers, args.repeats = 64 / 1024, "1,2", 1
    counts = [int(n) for n in args.receivers.split(",")]
    names = args.methods.split(",")
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    nbytes = int(args.gib * GIB)

    print(machine_facts())
    print(
        f"{nbytes / MIB:.0f} MiB per receiver, median of {args.repeats} repeats after {WARMUPS} "
        f"warm-ups, in each of {args.turns} turns; GB/s = 1e9 bytes per receiver per second; "
        f"all figures from this run"
    )
    copies = memcpy_seconds(nbytes, args.repeats)
    rows = [Row("memcpy", 0, copies, copies, copies)]
    limit_gbs = nbytes / statistics.median(rows[0].took) / 1e9
    # Taking turns, a burst of noise on the machine falls on every method alike rather
    # than on whichever ran then.
    pooled = {(name, count): Row(name, count, [], [], []) for name in names for count in counts}
    for _ in range(args.turns):
        for (name, count), row in pooled.items():
            for pool, times in zip(
                (row.took, row.moving, row.held),
                run_method(name, count, nbytes, args.repeats),
                strict=True,
            ):
                pool.extend(times)
            print(f"  {name}, {count} receivers: {statistics.median(row.took):.3f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
    rows.extend(pooled.values())
    print(table(rows, nbytes, limit_gbs))


if __name__ == "__main__":
    main()
