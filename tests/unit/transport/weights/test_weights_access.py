"""Who a node's weight plane is open to: loopback only in a local run; across machines,
requests served only with the run key's MAC (a replay refused), and buckets that carry a
MAC, so bytes altered on the way are refused even when their CRC-32C still matches.

Real UCX nodes in this process; the asker in the request tests is a bare UCX node that
speaks the wire format itself, as anyone who can reach the port could.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import crc32c
import numpy as np
import pytest
import torch

from asyncrl.actors.actor import WorkerContext
from asyncrl.actors.worker.weight_following import weights_access
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.transport.identity import ensure_run_secret
from asyncrl.transport.weights import WeightsAccess, weights_key
from asyncrl.transport.weights.base import NeedsPlan, Received, WeightsPlan
from asyncrl.transport.weights.layout import Manifest, ManifestError
from asyncrl.transport.weights.mac import (
    MAC_BYTES,
    BucketCheck,
    Refused,
    RequestGuard,
    RequestKey,
)
from asyncrl.transport.weights.ucx import UcxPublisher, UcxReceiver
from asyncrl.transport.weights.ucx.node import Request, UcxNode
from asyncrl.transport.weights.ucx.wire import (
    HEADER_BYTES,
    REQUEST_TAG,
    RangeRequest,
    Status,
    TagSource,
    decode_header,
    encode_request,
)
from tests.support.listeners import listening
from tests.unit.transport.weights.test_weights_shm import receive, state

pytestmark = pytest.mark.timeout(60)

KEY = weights_key(b"k" * 32)
ACROSS = WeightsAccess(local=False, key=KEY)
BUCKET = 1 / 1024  # MiB: 1 KiB buckets, several per version


# --- the bind address -----------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    return host == "::1" or host.startswith("127.") or host == "::ffff:127.0.0.1"


def test_a_local_node_listens_on_loopback_only_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UCX_NET_DEVICES", "all")  # the context's setting wins over it
    before = listening()
    node = UcxNode(local=True)
    try:
        opened = listening() - before
        assert opened, "UCX opened no TCP listener: nothing was checked"
        assert all(is_loopback(host) for host, _ in opened), opened
    finally:
        node.close()


def test_a_node_of_a_run_across_machines_listens_where_other_machines_reach_it() -> None:
    before = listening()
    node = UcxNode(local=False)
    try:
        opened = listening() - before
        if all(is_loopback(host) for host, _ in opened):
            pytest.skip("this host has no network interface but loopback")
    finally:
        node.close()


def worker_context(tmp_path: Path, local: bool) -> WorkerContext:
    cfg = config_from_dict({"run": {"dir": str(tmp_path / "run")}})
    return WorkerContext("generate-0", "generate", cfg, "run", 1.0, 60.0, 1 << 20, 0, local=local)


def test_a_worker_takes_the_runs_key_and_cannot_cross_machines_without_it(
    tmp_path: Path,
) -> None:
    assert weights_access(worker_context(tmp_path, local=True)) == WeightsAccess(local=True)
    with pytest.raises(ValueError, match=r"run\.secret"):
        weights_access(worker_context(tmp_path, local=False))
    secret = ensure_run_secret(tmp_path / "run" / "run.secret")
    access = weights_access(worker_context(tmp_path, local=False))
    assert access == WeightsAccess(local=False, key=weights_key(secret))
    assert "key" not in repr(access).replace("WeightsAccess", "")  # never in a log line


# --- requests -------------------------------------------------------------------------------


@pytest.fixture
def source() -> Iterator[UcxPublisher]:
    publisher = UcxPublisher(bucket_mb=BUCKET, access=ACROSS)
    publisher.publish(1, state(1))
    yield publisher
    publisher.close()


@pytest.fixture
def asker() -> Iterator[UcxNode]:
    node = UcxNode(local=False)
    yield node
    node.close()


class Ask:
    """One reply tag's receives, posted before asking, so the answer lands in them."""

    def __init__(self, asker: UcxNode, to: bytes, tag: int, nbytes: int) -> None:
        self.header = np.zeros(HEADER_BYTES, np.uint8)
        self.body = np.zeros(nbytes, np.uint8)
        self.got: list[Request] = [
            asker.recv(to, self.header, tag),
            asker.recv(to, self.body, tag + 1),
        ]

    def answered(self, within_s: float = 10.0) -> bool:
        deadline = time.monotonic() + within_s
        while not all(r.completed for r in self.got):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True


def test_only_a_request_sealed_with_the_runs_key_for_this_node_is_served_and_only_once(
    source: UcxPublisher, asker: UcxNode
) -> None:
    to, tags, staged = source.address, TagSource(), source.store.buffers[0]
    assert staged is not None
    guard = source.server.guard

    def request(tag: int) -> RangeRequest:
        return RangeRequest(1, 0, 100, tag, asker.address, 0, tags.sequence())

    def sealed(tag: int) -> np.ndarray:
        return encode_request(request(tag), RequestKey(KEY).seal(to))

    served_tag = tags.take()
    served = sealed(served_tag)
    refused = {
        "no MAC": lambda tag: encode_request(request(tag)),
        "another key": lambda tag: encode_request(
            request(tag), RequestKey(weights_key(b"x" * 32)).seal(to)
        ),
        "sealed for another node": lambda tag: encode_request(
            request(tag), RequestKey(KEY).seal(asker.address)
        ),
        "a replay": lambda tag: served,  # asks for an answer on served_tag
    }
    first = Ask(asker, to, served_tag, 100)
    asker.send(to, served, REQUEST_TAG)
    assert first.answered() and decode_header(first.header)[0] is Status.OK
    assert bytes(first.body) == bytes(staged[:100])
    for count, (case, frame_for) in enumerate(refused.items(), start=1):
        tag = served_tag if case == "a replay" else tags.take()
        ask = Ask(asker, to, tag, 100)
        asker.send(to, frame_for(tag), REQUEST_TAG)
        deadline = time.monotonic() + 10
        while guard.refused < count:
            assert time.monotonic() < deadline, f"{case}: neither refused nor served"
            time.sleep(0.005)
        assert not ask.answered(within_s=0.3), f"{case}: served"
        asker.send(to, sealed(tag), REQUEST_TAG)  # a good one ends the receives posted
        assert ask.answered(), case
        assert decode_header(ask.header)[0] is Status.OK


def test_a_receiver_and_a_relay_across_machines_fetch_with_the_runs_key() -> None:
    publisher = UcxPublisher(bucket_mb=BUCKET, access=ACROSS)
    relay = UcxReceiver(bucket_mb=BUCKET, stall_timeout_s=5, access=ACROSS)
    last = UcxReceiver(bucket_mb=BUCKET, stall_timeout_s=5, access=ACROSS)
    try:
        manifest = publisher.publish(1, state(1)).manifest
        assert len(manifest["macs"]) == len(manifest["checksums"]) * MAC_BYTES  # type: ignore[arg-type]
        for receiver, source, address in ((relay, "trainer", publisher.address),
                                          (last, "relay", relay.address)):  # fmt: skip
            got = receive(receiver, WeightsPlan(1, manifest, source, address))  # type: ignore[arg-type]
            assert isinstance(got, Received) and got.source == source, got
            assert all(torch.equal(got.state[n], t) for n, t in state(1).items())
        assert publisher.server.guard.refused == relay.server.guard.refused == 0  # type: ignore[union-attr]
    finally:
        for node in (last, relay, publisher):
            node.close()


def test_the_replay_window_takes_each_sequence_once_in_any_order_within_it() -> None:
    guard = RequestGuard(KEY, b"this node", lambda *_, **__: None)
    for sequence in (5, 3, 4, 1, 1030, 7):  # 7 is still within 1,024 of 1,030
        guard.admit(b"peer", sequence)
    guard.admit(b"another peer", 5)  # each peer has its own
    for sequence, why in ((7, "seen before"), (1030, "seen before"), (6, "too old")):
        with pytest.raises(Refused, match=why):
            guard.admit(b"peer", sequence)


def test_a_flood_of_refusals_is_one_log_line_with_its_count() -> None:
    lines: list[dict[str, object]] = []
    guard = RequestGuard(KEY, b"this node", lambda event, **fields: lines.append(fields))
    for _ in range(1000):
        with pytest.raises(Refused) as refused:
            guard.verify(b"fields", b"\0" * MAC_BYTES)
        guard.note(refused.value)
    assert guard.refused == 1000
    assert len(lines) == 1 and lines[0]["refused"] == 1, lines
    assert "wrong MAC" in str(lines[0]["reason"])


# --- buckets --------------------------------------------------------------------------------


def test_a_local_publisher_signs_nothing_and_its_receivers_check_crc() -> None:
    publisher = UcxPublisher(bucket_mb=BUCKET)
    try:
        manifest = Manifest.from_payload(publisher.publish(1, state(1)).manifest)
        assert manifest.macs == b""
        buffer = publisher.store.buffers[0]
        assert buffer is not None
        check = BucketCheck(manifest, WeightsAccess())
        assert check(0, memoryview(buffer)[: manifest.bucket_range(0)[1]])
        with pytest.raises(ManifestError, match="no bucket MACs"):
            BucketCheck(manifest, ACROSS)  # a run across machines takes no CRC-only version
    finally:
        publisher.close()


def same_crc(data: bytearray, at: int, fix_at: int) -> None:
    """Flip the byte at ``at`` and rewrite the 4 bytes at ``fix_at`` so that the CRC-32C of
    ``data`` is what it was: CRC is linear, so the 32 bits to rewrite solve a linear system
    over GF(2), which anyone altering bytes on the wire can solve as well."""
    before = crc32c.crc32c(bytes(data))
    data[at] ^= 0xFF
    zeros = crc32c.crc32c(bytes(len(data)))

    def effect(bit: int) -> int:  # what flipping one bit of the 4 does to the CRC
        unit = bytearray(len(data))
        unit[fix_at + bit // 8] = 1 << (bit % 8)
        return crc32c.crc32c(bytes(unit)) ^ zeros

    rows = [(effect(bit), 1 << bit) for bit in range(32)]
    target, chosen = crc32c.crc32c(bytes(data)) ^ before, 0
    for pivot in range(32):  # Gaussian elimination on (effect, which bits) pairs
        mask = 1 << pivot
        index = next(i for i in range(pivot, 32) if rows[i][0] & mask)
        rows[pivot], rows[index] = rows[index], rows[pivot]
        for i in range(32):
            if i != pivot and rows[i][0] & mask:
                rows[i] = (rows[i][0] ^ rows[pivot][0], rows[i][1] ^ rows[pivot][1])
    for pivot in range(32):
        if target >> pivot & 1:
            chosen ^= rows[pivot][1]
    for bit in range(32):
        if chosen >> bit & 1:
            data[fix_at + bit // 8] ^= 1 << (bit % 8)
    assert crc32c.crc32c(bytes(data)) == before


@pytest.mark.parametrize("altered", ["bytes, CRC intact", "the MAC"])
def test_a_bucket_altered_on_the_way_is_refused(altered: str) -> None:
    publisher = UcxPublisher(bucket_mb=BUCKET, access=ACROSS)
    receiver = UcxReceiver(bucket_mb=BUCKET, stall_timeout_s=5, access=ACROSS)
    try:
        payload = publisher.publish(1, state(1)).manifest
        manifest = Manifest.from_payload(payload)
        buffer = publisher.store.buffers[0]
        assert buffer is not None
        start, end = manifest.bucket_range(1)
        if altered == "the MAC":
            macs = bytearray(manifest.macs)
            macs[MAC_BYTES + 3] ^= 1
            payload = {**payload, "macs": bytes(macs)}
        else:  # as a man in the middle would, for every copy sent
            bucket = bytearray(buffer[start:end].tobytes())
            same_crc(bucket, at=100, fix_at=200)
            buffer[start:end] = np.frombuffer(bytes(bucket), np.uint8)
        got = receive(receiver, WeightsPlan(1, payload, "trainer", publisher.address))
        assert isinstance(got, NeedsPlan), got
        assert "bucket 1 of version 1 corrupt twice" in got.reason
    finally:
        receiver.close()
        publisher.close()


def test_a_plan_without_macs_is_refused_across_machines() -> None:
    local = UcxPublisher(bucket_mb=BUCKET)
    receiver = UcxReceiver(bucket_mb=BUCKET, access=ACROSS)
    try:
        manifest = local.publish(1, state(1)).manifest
        with pytest.raises(ManifestError, match="no bucket MACs"):
            receiver.want(WeightsPlan(1, manifest, "trainer", local.address))
    finally:
        receiver.close()
        local.close()
