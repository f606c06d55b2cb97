"""Thousands of malformed frames at a live scheduler's ROUTER, in the middle of a run.

Every frame set gets an error reply, or, past the size limit, is dropped by libzmq; the
scheduler stays up, and once the trainer joins, the run ends with every result exact.
Then every field of every message kind, hostile, from a registered worker's connection at
a scheduler of its own: every request is answered, and the scheduler is the same process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.transport import protocol as p
from tests.support import hostile
from tests.support.cluster import ROLES, Cluster
from tests.support.runlink import curve_client, worker_routing_id

pytestmark = pytest.mark.timeout(300)

LIMIT = 1 << 20  # scheduler.max_message_mb = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("flood"), scheduler={"max_message_mb": 1})
    c.scheduler()
    for role in ROLES:
        if role != "train":  # the run waits for it until the flood is over
            c.worker(role)
    yield c
    c.stop_all()


class Prober:
    """A raw DEALER that sends frames and says whether a reply came; with ``identity``,
    it speaks from that connection (a worker's)."""

    def __init__(self, c: Cluster, identity: str | None = None) -> None:
        self.ctx = zmq.Context.instance()
        self.run_dir = c.run_dir
        self.endpoint = c.endpoints()["control"]
        self.identity = identity
        self.socket = self._dial()
        self.replies = self.dropped = 0

    def _dial(self) -> zmq.Socket:
        socket = self.ctx.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if self.identity is not None:
            socket.setsockopt(zmq.IDENTITY, self.identity.encode())
        curve_client(socket, self.run_dir)
        socket.connect(self.endpoint)
        return socket

    def send(self, frames: list[bytes]) -> p.Message | None:
        self.socket.send_multipart(frames)
        if not self.socket.poll(3000 if all(len(f) <= LIMIT for f in frames) else 300):
            self.dropped += 1
            self.socket.close()
            self.socket = self._dial()  # libzmq cut the oversized sender off
            return None
        self.replies += 1
        return p.decode(self.socket.recv_multipart())

    def flood(self, requests: list[list[bytes]], window: int = 256) -> list[tuple[p.Message, int]]:
        """Every reply to ``requests``, up to ``window`` of them in flight at once, as
        (reply, req_id) in the order they came."""
        replies: list[tuple[p.Message, int]] = []
        sent = 0
        while len(replies) < len(requests):
            while sent < len(requests) and sent - len(replies) < window:
                self.socket.send_multipart(requests[sent])
                sent += 1
            assert self.socket.poll(5000), f"{len(replies)} replies to {sent} requests"
            replies.append(p.decode_with_id(self.socket.recv_multipart()))
        return replies


def header(version: object, kind: object, req_id: object, body: object) -> bytes:
    return msgpack.packb([version, kind, req_id, body])


values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
# Any kind but STOP: a well-formed Stop is a valid request, and would end the run.
kinds = st.sampled_from([int(k) for k in p.Kind]) | st.integers(-1000, 1000)
kinds = kinds.filter(lambda k: k != p.Kind.STOP)


def truncated_array(cut: int) -> list[bytes]:
    result = p.Result(0, {"tokens": np.arange(64, dtype=np.int32)}, (0, 0))
    frames = [bytes(f) for f in p.encode(p.Complete("w", 1, 1, (result,)), 9)]
    return [frames[0], frames[1][: max(0, len(frames[1]) - cut)]]


frame_sets = st.one_of(
    st.lists(st.binary(max_size=300), min_size=1, max_size=4),
    st.builds(lambda v, k, b: [header(v, k, 1, b)], st.integers(2, 99), kinds, values),
    st.builds(lambda k, b: [header(p.PROTOCOL_VERSION, k, 2, b)], kinds, st.lists(values)),
    st.builds(truncated_array, st.integers(1, 255)),
    st.builds(lambda n: [header(1, int(p.Kind.STATUS), 3, []), b"\0" * n], st.integers(0, 99)),
    st.just([b"\0" * (LIMIT + 1)]),  # one frame over the limit: dropped by libzmq
    st.just([header(1, int(p.Kind.STATUS), 4, [])] + [b"\0" * (LIMIT // 2)] * 3),  # sum over
)


@settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
@given(frames=frame_sets)
def test_every_malformed_frame_is_answered_or_dropped(cluster: Cluster, frames: list) -> None:
    prober = _prober(cluster)
    reply = prober.send(frames)
    oversized = any(len(f) > LIMIT for f in frames)
    if oversized:
        assert reply is None
    else:
        assert reply is not None, frames[:1]
        assert isinstance(reply, p.Error | p.StatusReply), reply


_probers: dict[int, Prober] = {}


def _prober(cluster: Cluster) -> Prober:
    if id(cluster) not in _probers:
        _probers[id(cluster)] = Prober(cluster)
    return _probers[id(cluster)]


def test_a_str_that_is_not_utf8_is_an_error_naming_its_field(cluster: Cluster) -> None:
    """Once a UnicodeDecodeError, which ended the scheduler (exit 1)."""
    pid = cluster.procs["scheduler"].pid
    reply = _prober(cluster).send(hostile.frames(p.Hello, (0,), hostile.BAD_UTF8, req_id=8))
    assert reply == p.Error("protocol", "Hello.worker: invalid UTF-8")
    assert cluster.procs["scheduler"].poll() is None and cluster.procs["scheduler"].pid == pid


def test_the_scheduler_stayed_up_and_the_run_is_exact(cluster: Cluster) -> None:
    prober = _prober(cluster)
    assert prober.replies > 1000 and prober.dropped >= 1
    assert cluster.procs["scheduler"].poll() is None
    status = prober.send([bytes(f) for f in p.encode(p.Status(), 5)])
    assert isinstance(status, p.StatusReply)
    assert status.summary["protocol_errors"] > 1000
    cluster.worker("train")
    assert cluster.wait("scheduler", 120) == 0
    cluster.check_exactly_once()


# --- every field of every message, hostile, from a registered worker ---------------------

ME = {"worker": "fuzz", "role": "generate", "protocol": p.PROTOCOL_VERSION}
# What a scheduler answers with: Ready .. StepDone.
ANSWERS = tuple(c for c in hostile.MESSAGES if p.Kind.READY <= c.KIND <= p.Kind.STEP_DONE)


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A scheduler with no workers but the test's own, which never times out."""
    c = Cluster(
        tmp_path_factory.mktemp("fields"),
        scheduler={"max_message_mb": 1, "worker_timeout_s": 600},
    )
    c.scheduler()
    yield c
    c.stop_all()


def hostile_requests() -> list[list[bytes]]:
    """Each field of each kind in turn hostile, with and without an array frame, as the
    worker ``ME`` names. A Stop that decodes is left out (the scheduler would drain and
    exit); Byes go last, since one that decodes ends the registration."""
    requests: list[list[bytes]] = []
    for cls in sorted(hostile.MESSAGES, key=lambda cls: cls is p.Bye):
        for path, _, _ in hostile.fields(cls):
            for raw in hostile.HOSTILE:
                for arrays in ((), (hostile.ARRAY_FRAME,)):
                    req_id = len(requests) + 1
                    frames = hostile.frames(cls, path, raw, known=ME, arrays=arrays, req_id=req_id)
                    if cls is not p.Stop or not hostile.decodes(p.decode, frames):
                        requests.append(frames)
    return requests


def test_every_field_hostile_is_answered_and_the_scheduler_lives_on(lone: Cluster) -> None:
    pid = lone.procs["scheduler"].pid
    worker = Prober(lone, worker_routing_id(lone.run_dir, ME["worker"], ME["role"]))
    hello = p.Hello(ME["worker"], ME["role"], p.PROTOCOL_VERSION, 1)
    assert isinstance(worker.send([bytes(f) for f in p.encode(hello)]), p.Ready)
    requests = hostile_requests()
    replies = worker.flood(requests)
    assert len(replies) == len(requests)
    kinds = Counter(f"{type(r).__name__} {getattr(r, 'code', '')}" for r, _ in replies)
    assert all(isinstance(r, ANSWERS) for r, _ in replies), kinds
    assert kinds["Error internal"] == 0, kinds  # no handler failed on what it was given
    assert kinds["Error protocol"] > len(requests) // 2 and len(kinds) > 5, kinds
    assert {req_id for _, req_id in replies} <= set(range(len(requests) + 1))
    assert lone.procs["scheduler"].poll() is None and lone.procs["scheduler"].pid == pid
    assert isinstance(worker.send([bytes(f) for f in p.encode(p.Status(), 1)]), p.StatusReply)
