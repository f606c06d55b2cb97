"""A weight publisher and weight receivers in real processes, for the weight-plane tests.

The test process plays the scheduler: it starts each node (multiprocessing, spawn), sends
it commands, hands receivers :class:`WeightsPlan`\\ s, and reads what each reports on its own
queue (one pair of queues per node, so that killing a node with SIGKILL breaks no other
node's queues). A receiver checks every version it gets against the same deterministic
state rebuilt locally (:func:`model_state`), tensor by tensor and byte for byte, and
reports the names of the tensors that differ.

Nodes run the UCX strategy unless started with ``strategy="shm"`` (and ``shm_dir``, the
publisher's slot directory) or ``strategy="ucx-map"`` (UCX with map_on_host: the publisher
stages into slot files in ``shm_dir``, receivers map them when on its host). Test hooks run
inside the node's own process, never in the library:

- ``pace_s`` (receivers): sleep before taking each range (UCX), or before checking a
  mapped version (shm), so a transfer lasts long enough to be interrupted mid-way;
- ``corrupt`` (publishers): flip one byte of the staged buffer just before the first
  range that covers it is sent (after the checksums were taken), and flip it back before
  the next one (``"once"``) or never (``"always"``);
- ``no_space`` (ucx-map publishers): /dev/shm has no room for any slot file;
- ``host`` (ucx-map receivers): the host identity the receiver believes it is on, so
  that one machine can play a receiver on another host.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from asyncrl.transport.weights.base import Announcement, NeedsPlan, Received, WeightsPlan

__all__ = [
    "MIB_STATE",
    "OUTCOME_S",
    "MiB",
    "Node",
    "Nodes",
    "mismatches",
    "model_state",
    "nodes",
    "plan_from",
    "publish",
    "shm_test_directory",
    "slot_files",
    "take",
    "wait_until",
]

MiB = 1 << 20
_START_S = 60.0  # spawning imports torch and UCX: slow on two busy cores
MIB_STATE = 16  # MiB of the state dicts that publish() and take() move
OUTCOME_S = 30.0  # how long a fetch or a map may take before a test gives up


# --- the state dicts ------------------------------------------------------------------


def model_state(version: int, mib: float) -> dict[str, torch.Tensor]:
    """A model-like state dict of about ``mib`` MiB, the same for the same ``version``.

    Mixed dtypes and odd sizes, so tensors start at padded offsets and ranges cut across
    tensors as well as buckets.
    """
    g = torch.Generator().manual_seed(1000 + version)
    unit = max(1, int(mib * MiB) // 16)  # bytes per share of the total
    hidden = 257
    state = {
        "embed.weight": torch.randn(unit * 4 // 4 // hidden, hidden, generator=g),
        "norm.weight": torch.randn(hidden, generator=g).to(torch.bfloat16),
        "step": torch.tensor([version], dtype=torch.int64),
    }
    for layer in range(2):
        p = f"layers.{layer}."
        state[p + "attn.qkv"] = torch.randn(unit * 2 // 2 // hidden, hidden, generator=g).to(
            torch.bfloat16
        )
        state[p + "mlp.up"] = torch.randn(unit // 2 + 1, generator=g).to(torch.float16)
        state[p + "mlp.down"] = torch.randn(unit // 4 + 5, generator=g)
        state[p + "mask"] = torch.rand(1001, generator=g) > 0.5
        state[p + "bias.q8"] = torch.randint(-128, 128, (333,), generator=g, dtype=torch.int8)
    state["lm_head.weight"] = torch.randn(unit * 4 // 2 // hidden, hidden, generator=g).to(
        torch.bfloat16
    )
    return state


def mismatches(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> list[str]:
    """The names whose tensors differ from ``want`` in name, dtype, shape or any byte."""
    bad = sorted(set(got) ^ set(want))
    for name in sorted(set(got) & set(want)):
        a, b = got[name], want[name]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(_bytes(a), _bytes(b)):
            bad.append(name)
    return bad


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def plan_from(announcement: Announcement | None, source: Node, version: int) -> WeightsPlan:
    """The plan the scheduler would hand out: ``version``'s manifest, pulled from ``source``."""
    assert announcement is not None and announcement.version == version
    return WeightsPlan(version, announcement.manifest, source.name, source.address)


# --- inside the node processes --------------------------------------------------------


def _publisher_main(
    name: str, commands: Any, reports: Any, options: dict[str, Any]
) -> None:  # pragma: no cover - runs in a child process
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    publisher: Any
    if options.get("strategy") == "shm":
        from pathlib import Path

        from asyncrl.transport.weights.shm import ShmPublisher

        publisher = ShmPublisher(Path(options["shm_dir"]), bucket_mb=options.get("bucket_mb", 4))
    else:
        from pathlib import Path

        from asyncrl.transport.weights.ucx import UcxPublisher

        if options.get("corrupt"):
            _corrupt_sends(*options["corrupt"])
        if options.get("no_space"):
            _no_room_in_shared_memory()
        mapped = options.get("strategy") == "ucx-map"
        publisher = UcxPublisher(
            bucket_mb=options.get("bucket_mb", 4),
            send_timeout_s=options.get("send_timeout_s", 2),
            share_dir=Path(options["shm_dir"]) if mapped else None,
        )
    reports.put(("ready", publisher.address))
    while True:
        command = commands.get()
        op = command[0]
        if op == "publish":
            _, version, mib = command
            announcement = publisher.publish(version, model_state(version, mib))
            reports.put(("announced", announcement))
        elif op == "served":
            reports.put(("served", publisher.server.served_bytes))
        elif op == "close":
            publisher.close()
            reports.put(("closed",))
            return


def _no_room_in_shared_memory() -> None:  # pragma: no cover - child process
    import errno

    from asyncrl.transport.weights.shm import slot_file

    def fallocate(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    slot_file.os.posix_fallocate = fallocate  # type: ignore[assignment]


def _corrupt_sends(offset: int, mode: str) -> None:  # pragma: no cover - child process
    """Flip the byte at ``offset`` while the first range covering it is sent."""
    from asyncrl.transport.weights.ucx import server

    original = server.Server._send
    covering = 0

    def send(self: Any, waiting: Any) -> None:
        nonlocal covering
        r = waiting.request
        if r.start <= offset < r.end:
            covering += 1
            if covering == 1 or (covering == 2 and mode == "once"):
                buffer = self.store.buffers[waiting.slot]
                buffer[offset] ^= 0xFF
        original(self, waiting)

    server.Server._send = send


def _receiver_main(
    name: str, commands: Any, reports: Any, options: dict[str, Any]
) -> None:  # pragma: no cover - runs in a child process
    os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
    receiver: Any
    if options.get("strategy") == "shm":
        from asyncrl.transport.weights.shm import ShmReceiver

        if options.get("pace_s"):
            _pace_checks(options["pace_s"])
        receiver = ShmReceiver()
    else:
        from asyncrl.transport.weights.ucx import UcxReceiver

        if options.get("pace_s"):
            _pace_ranges(options["pace_s"])
        receiver = UcxReceiver(
            bucket_mb=options.get("bucket_mb", 3),
            stall_timeout_s=options.get("stall_timeout_s", 2),
        )
        if options.get("strategy") == "ucx-map":
            from asyncrl.transport.weights.host_aware import HostAwareReceiver
            from asyncrl.transport.weights.shm import ShmReceiver

            receiver = HostAwareReceiver(receiver, ShmReceiver())
            if options.get("host"):
                receiver._host = options["host"]
    reports.put(("ready", receiver.address))
    sizes: dict[int, float] = {}  # version: MiB of the state it was built with
    current: Received | None = None
    while True:
        try:
            command = commands.get(timeout=0.002)
        except queue.Empty:
            command = None
        if command is not None:
            op = command[0]
            if op == "want":
                _, plan, mib = command
                sizes[plan.version] = mib
                receiver.want(plan)
            elif op == "address":
                reports.put(("address", receiver.address))
            elif op == "progress":
                checked = getattr(receiver, "checked_bytes", 0)
                reports.put(("progress", checked, receiver.target))
            elif op == "check_loaded":
                assert current is not None
                want = model_state(current.version, sizes[current.version])
                reports.put(("loaded", current.version, mismatches(current.state, want)))
            elif op == "close":
                receiver.close()
                reports.put(("closed",))
                return
        outcome = receiver.poll()
        if isinstance(outcome, Received):
            bad = mismatches(outcome.state, model_state(outcome.version, sizes[outcome.version]))
            if not bad:
                receiver.loaded(outcome)
                current = outcome
            # Without its tensors: pickling them for the queue would move their storage
            # into fresh shared memory, and the model would no longer run on the
            # receiver's buffer that "check_loaded" is meant to check.
            reports.put(("received", dataclasses.replace(outcome, state={}), bad))
        elif isinstance(outcome, NeedsPlan):
            reports.put(("needs_plan", outcome, getattr(receiver, "checked_bytes", 0)))


def _pace_ranges(pace_s: float) -> None:  # pragma: no cover - child process
    from asyncrl.transport.weights.ucx import fetch

    original = fetch.Fetch._finish

    def finish(self: Any, r: Any) -> None:
        time.sleep(pace_s)
        original(self, r)

    fetch.Fetch._finish = finish


def _pace_checks(pace_s: float) -> None:  # pragma: no cover - child process
    from asyncrl.transport.weights.shm import strategy

    original = strategy.ShmReceiver._bad_buckets

    def check(self: Any, mapped: Any, manifest: Any) -> list[int]:
        time.sleep(pace_s)
        return original(self, mapped, manifest)

    strategy.ShmReceiver._bad_buckets = check


# --- in the test process --------------------------------------------------------------


@dataclass
class Node:
    """One node process, its command queue, and what it reported but was not yet read."""

    name: str
    process: Any
    commands: Any
    reports: Any
    address: bytes = b""
    backlog: list[tuple[Any, ...]] = field(default_factory=list)
    kept: int = 0  # checked bytes a receiver kept when its last fetch lost its source

    def send(self, *command: Any) -> None:
        self.commands.put(command)

    def next(self, kind: str, timeout: float) -> tuple[Any, ...]:
        """The next report of ``kind`` (the fields after it), read within ``timeout`` s."""
        return self._first_of((kind,), timeout)[1:]

    def ask(self, kind: str, *command: Any, timeout: float = 10) -> tuple[Any, ...]:
        self.send(*command)
        return self.next(kind, timeout)

    def outcome(self, timeout: float) -> Received | NeedsPlan:
        """The fetch's outcome: a Received (checked here too) or a NeedsPlan."""
        return self._outcome(self._first_of(("received", "needs_plan"), timeout))

    def _first_of(self, kinds: tuple[str, ...], timeout: float) -> tuple[Any, ...]:
        """The first report of one of ``kinds``, kept ones first; others are kept."""
        for i, report in enumerate(self.backlog):
            if report[0] in kinds:
                return self.backlog.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no {' or '.join(kinds)} in {timeout:g} s")
            try:
                report = self.reports.get(timeout=min(left, 0.5))
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(
                        f"{self.name} exited ({self.process.exitcode}) before {kinds}"
                    ) from None
                continue
            if report[0] in kinds:
                return report
            self.backlog.append(report)

    def _outcome(self, report: tuple[Any, ...]) -> Received | NeedsPlan:
        if report[0] == "received":
            received, bad = report[1], report[2]
            assert not bad, f"{self.name}: version {received.version} differs in {bad}"
            return received
        self.kept = report[2]
        return report[1]

    def checked(self) -> int:
        return self.ask("progress", "progress")[0]

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(10)


class Nodes:
    """The node processes of one test; :meth:`stop_all` leaves none behind."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        self.all: list[Node] = []

    def publisher(self, name: str = "trainer", **options: Any) -> Node:
        return self._start(name, _publisher_main, options)

    def receiver(self, name: str, **options: Any) -> Node:
        return self._start(name, _receiver_main, options)

    def started(self, *started: Node) -> None:
        """Wait until every node in ``started`` reported its address."""
        for node in started:
            (node.address,) = node.next("ready", _START_S)

    def _start(self, name: str, target: Any, options: dict[str, Any]) -> Node:
        commands, reports = self._ctx.Queue(), self._ctx.Queue()
        process = self._ctx.Process(
            target=target, args=(name, commands, reports, options), name=name, daemon=True
        )
        process.start()
        node = Node(name, process, commands, reports)
        self.all.append(node)
        return node

    def stop_all(self) -> None:
        for node in self.all:
            if node.process.is_alive():
                node.send("close")
        for node in self.all:
            node.process.join(5)
            if node.process.is_alive():
                node.process.kill()
                node.process.join(5)
            for q in (node.commands, node.reports):
                q.close()
                q.cancel_join_thread()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` every 10 ms (fetches are caught mid-way by it) until true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no {what} in {timeout:g} s")
        time.sleep(0.01)


@contextmanager
def nodes() -> Iterator[Nodes]:
    made = Nodes()
    try:
        yield made
    finally:
        made.stop_all()


# --- mapped weights: shared by the shm and map_on_host tests ---------------------------


@contextmanager
def shm_test_directory(tmp_path: Path) -> Iterator[Path]:
    """A slot directory for one test, in /dev/shm where there is one; emptied after it."""
    directory = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    made = directory / f"asyncrl-test-{tmp_path.name}"
    try:
        yield made
    finally:
        for path in made.glob("*"):
            path.unlink()
        if made.exists():
            made.rmdir()


def slot_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.weights"))


def publish(trainer: Node, version: int) -> Announcement:
    (announcement,) = trainer.ask("announced", "publish", version, MIB_STATE, timeout=OUTCOME_S)
    return announcement


def take(node: Node, announcement: Announcement, source: Node, version: int) -> Received:
    """``node`` fetches or maps ``version`` from ``source``; it must arrive whole and exact."""
    node.send("want", plan_from(announcement, source, version), MIB_STATE)
    got = node.outcome(OUTCOME_S)  # a Received is checked byte for byte in the node
    assert isinstance(got, Received), f"{node.name}: {got}"
    assert got.version == version
    return got
