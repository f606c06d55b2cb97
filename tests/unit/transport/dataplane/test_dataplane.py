"""The data plane's store, server and fetcher, over real ZeroMQ sockets in one process."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.transport import protocol as p
from asyncrl.transport.dataplane import (
    PayloadFetcher,
    PayloadServer,
    PayloadStore,
    PayloadsUnavailable,
)
from asyncrl.transport.dataplane.store import shared_path, sweep_stale
from asyncrl.transport.dataplane.wire import REPLY, REQUEST, Code
from asyncrl.transport.security import ClientKeys, payload_keys
from tests.support import hostile

MAX_BYTES = 64 << 20
KEYS = payload_keys(b"k" * 32)  # the run's payload key pair, as a run derives it


@pytest.fixture
def holder():
    store = PayloadStore("generate-0")
    server = PayloadServer(store, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES, keys=KEYS)
    yield store
    server.close()


@pytest.fixture
def fetcher():
    fetcher = PayloadFetcher(timeout_s=2.0, max_message_bytes=MAX_BYTES, keys=KEYS)
    yield fetcher
    fetcher.close()


def payload(i: int, size: int = 1000) -> p.Payload:
    return {"ids": np.arange(size, dtype=np.int32) + i, "n": i, "name": f"g{i}"}


def test_fetch_returns_what_was_put(holder: PayloadStore, fetcher: PayloadFetcher) -> None:
    refs = [holder.put(payload(i)) for i in range(5)]
    assert all(r.address.startswith("tcp://127.0.0.1:") for r in refs)
    got = fetcher.fetch(refs)
    for i, data in enumerate(got):
        assert data["n"] == i and data["name"] == f"g{i}"
        np.testing.assert_array_equal(data["ids"], np.arange(1000, dtype=np.int32) + i)
    assert fetcher.fetched_bytes == sum(r.size for r in refs)


def test_fetch_from_two_holders_at_once(holder: PayloadStore, fetcher: PayloadFetcher) -> None:
    other = PayloadStore("logp-0")
    server = PayloadServer(other, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES, keys=KEYS)
    try:
        refs = [holder.put(payload(1)), other.put(payload(2)), holder.put(payload(3))]
        assert [d["n"] for d in fetcher.fetch(refs)] == [1, 2, 3]
    finally:
        server.close()


def test_freed_and_foreign_keys_are_reported_not_served(
    holder: PayloadStore, fetcher: PayloadFetcher
) -> None:
    kept, freed = holder.put(payload(1)), holder.put(payload(2))
    holder.discard([freed.key])
    restarted = msgspec.structs.replace(kept, store="0" * 16)  # a predecessor's reference
    with pytest.raises(PayloadsUnavailable) as caught:
        fetcher.fetch([kept, freed, restarted])
    failures = caught.value.failures
    assert [f.index for f in failures] == [1, 2]
    assert "no longer has it" in failures[0].reason
    assert "restarted" in failures[1].reason


def test_corrupt_bytes_are_refetched_then_refused(
    holder: PayloadStore, fetcher: PayloadFetcher
) -> None:
    ref = holder.put(payload(7))
    holder._images[ref.key][-200] ^= 0xFF  # rotted at rest
    with pytest.raises(PayloadsUnavailable) as caught:
        fetcher.fetch([ref])
    assert "checksum" in caught.value.failures[0].reason
    assert fetcher.refetched == 1  # asked once more before giving up


def test_a_dead_holder_times_out_and_its_socket_is_dropped(fetcher: PayloadFetcher) -> None:
    store = PayloadStore("generate-1")
    server = PayloadServer(store, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES, keys=KEYS)
    ref = store.put(payload(1))
    server.close()
    fetcher.connect_timeout_s = 0.3
    started = time.monotonic()
    with pytest.raises(PayloadsUnavailable) as caught:
        fetcher.fetch([ref])
    assert "no connection to its holder" in caught.value.failures[0].reason
    assert time.monotonic() - started < fetcher.timeout_s  # not the whole fetch timeout
    assert ref.address not in fetcher._sockets


def test_a_dead_holder_of_several_payloads_is_waited_for_once(fetcher: PayloadFetcher) -> None:
    store = PayloadStore("generate-1")
    server = PayloadServer(store, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES, keys=KEYS)
    refs = [store.put(payload(i)) for i in range(4)]
    server.close()
    # Waited for once, it takes one connect timeout; once per payload, four: the bound
    # between them leaves a busy machine two seconds of its own.
    fetcher.timeout_s, fetcher.connect_timeout_s = 30.0, 1.0
    started = time.monotonic()
    with pytest.raises(PayloadsUnavailable) as caught:
        fetcher.fetch(refs)
    assert [f.index for f in caught.value.failures] == [0, 1, 2, 3]
    assert time.monotonic() - started < 3 * fetcher.connect_timeout_s  # not once per payload


class _ConnectionLostAfterFirstSend(zmq.Socket):
    """A holder's connection that is up for the first request and gone for the next, as
    when the holder's host died silently and the connection is reset once it boots."""

    sends = 0

    def poll(self, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
        if flags == zmq.POLLOUT and _ConnectionLostAfterFirstSend.sends >= 1:
            return 0
        return super().poll(timeout, flags)

    def send(self, data: object, *args: object, **kwargs: object) -> object:
        _ConnectionLostAfterFirstSend.sends += 1
        return super().send(data, *args, **kwargs)


class _LosingContext(zmq.Context):
    _socket_class = _ConnectionLostAfterFirstSend


def _losing_fetcher() -> PayloadFetcher:
    fetcher = PayloadFetcher(timeout_s=2.0, max_message_bytes=MAX_BYTES, keys=KEYS)
    fetcher._ctx.term()
    fetcher._ctx = _LosingContext()
    fetcher.connect_timeout_s = 0.3
    _ConnectionLostAfterFirstSend.sends = 0
    return fetcher


def _failures(fetcher: PayloadFetcher, refs: list[p.PayloadRef]) -> list:
    try:
        with pytest.raises(PayloadsUnavailable) as caught:
            fetcher.fetch(refs)
    finally:
        fetcher.close()
    return sorted(caught.value.failures, key=lambda f: f.index)


def test_a_connection_lost_between_two_requests_fails_both(holder: PayloadStore) -> None:
    fetcher = _losing_fetcher()
    failures = _failures(fetcher, [holder.put(payload(1)), holder.put(payload(2))])
    # The first request went with the socket: reported, not waited for on a closed one.
    assert [f.index for f in failures] == [0, 1]
    assert all("no connection to its holder" in f.reason for f in failures)
    assert _ConnectionLostAfterFirstSend.sends == 1


def test_a_corrupt_payload_whose_holder_is_gone_for_the_second_ask_is_reported(
    holder: PayloadStore,
) -> None:
    ref = holder.put(payload(7))
    holder._images[ref.key][-200] ^= 0xFF
    fetcher = _losing_fetcher()
    failures = _failures(fetcher, [ref])  # never a payload of None, returned as fetched
    assert len(failures) == 1 and "no connection to its holder" in failures[0].reason
    assert fetcher.refetched == 1


def test_store_reports_only_acknowledged_keys_and_tracks_bytes() -> None:
    store = PayloadStore("w")
    a, b = store.put(payload(1, 100)), store.put(payload(2, 50))
    assert store.acknowledged() == ()
    store.acknowledge([a.key])
    assert store.acknowledged() == (a.key,)
    assert store.stats().bytes == a.size + b.size
    assert store.discard([a.key, b.key, 999]) == a.size + b.size
    stats = store.stats()
    assert (stats.payloads, stats.bytes, stats.peak_bytes) == (0, 0, a.size + b.size)
    assert store.acknowledged() == ()


def test_a_reader_on_the_holders_host_maps_the_payload_without_asking(tmp_path: Path) -> None:
    store = PayloadStore("generate-0", "tcp://127.0.0.1:9", shared_dir=tmp_path)  # no server
    ref = store.put(payload(5, 100_000))
    assert shared_path(tmp_path, ref.store, ref.key).stat().st_size == ref.size
    reader = PayloadFetcher(
        timeout_s=0.5, max_message_bytes=MAX_BYTES, keys=KEYS, shared_dir=tmp_path
    )
    try:
        (got,) = reader.fetch([ref])
        np.testing.assert_array_equal(got["ids"], np.arange(100_000, dtype=np.int32) + 5)
        got["ids"][0] = -1  # copy-on-write: the reader's own page, not the holder's
        assert reader.fetch([ref])[0]["ids"][0] == 5
        assert (reader.mapped_bytes, reader.fetched_bytes) == (2 * ref.size, 0)
    finally:
        reader.close()
    store.discard([ref.key])
    assert not shared_path(tmp_path, ref.store, ref.key).exists()
    store.close()
    assert not any(tmp_path.iterdir())


def test_a_rotted_shared_file_is_asked_for_again_then_refused(tmp_path: Path) -> None:
    store = PayloadStore("generate-0", shared_dir=tmp_path)
    server = PayloadServer(store, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES, keys=KEYS)
    reader = PayloadFetcher(
        timeout_s=2.0, max_message_bytes=MAX_BYTES, keys=KEYS, shared_dir=tmp_path
    )
    try:
        ref = store.put(payload(9))
        store._images[ref.key][-200] ^= 0xFF  # the file's own page: a reader sees it too
        with pytest.raises(PayloadsUnavailable) as caught:
            reader.fetch([ref])
        assert "checksum" in caught.value.failures[0].reason and reader.refetched == 1
    finally:
        reader.close()
        server.close()
        store.close()


def test_a_new_store_removes_what_killed_stores_left_in_shared_memory(tmp_path: Path) -> None:
    left = PayloadStore("generate-0", shared_dir=tmp_path)
    left.put(payload(1))
    (left.directory / "owner").write_text(str(_gone_pid()))
    alive = PayloadStore("logp-0", shared_dir=tmp_path)  # this process: kept
    PayloadStore("generate-1", shared_dir=tmp_path)
    assert not left.directory.exists() and alive.directory.exists()


def test_a_store_name_that_leads_out_of_shared_memory_is_refused_where_it_enters(
    tmp_path: Path,
) -> None:
    # A payload kept outside the readers' shared memory, and a directory there that a
    # forged name can step through: "asyncrl-payloads-x/../../elsewhere/...".
    (tmp_path / "elsewhere").mkdir()
    kept = PayloadStore("generate-0", shared_dir=tmp_path / "elsewhere")
    ref = kept.put(payload(3))
    shm = tmp_path / "shm"
    (shm / "asyncrl-payloads-x").mkdir(parents=True)
    forged = f"x/../../elsewhere/asyncrl-payloads-{ref.store}"
    header, *arrays = p.encode(p.Complete("generate-1", 1, 2, (p.Result(3, {}, None, ref),)))
    version, kind, req_id, body = msgspec.msgpack.decode(header)
    body[3][0][3][2] = forged  # Complete.results[0].ref.store, as a hostile worker sends it
    with pytest.raises(p.ProtocolError, match=r"Complete\.results\[0\]\.ref: store 'x/\.\./"):
        p.decode([msgspec.msgpack.encode([version, kind, req_id, body]), *arrays])
    with pytest.raises(ValueError, match="is not a store name"):
        shared_path(shm, forged, ref.key)
    with pytest.raises(ValueError, match="is not a store name"):
        p.Held("generate-1", "../x", (1,))
    kept.close()


def _gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_curve_admits_the_runs_workers_only(holder: PayloadStore, fetcher: PayloadFetcher) -> None:
    ref = holder.put(payload(3))
    other = payload_keys(b"o" * 32)
    # Knows the holder's public key, but is not the run's payload key pair.
    stranger_keys = ClientKeys(other.public, other.secret, server_public=KEYS.public)
    stranger = PayloadFetcher(timeout_s=0.5, max_message_bytes=MAX_BYTES, keys=stranger_keys)
    plain = zmq.Context.instance().socket(zmq.DEALER)  # no CURVE at all, on loopback
    plain.setsockopt(zmq.LINGER, 0)
    # A refused handshake takes the socket's only pipe away until it reconnects, and a
    # DEALER with no pipe blocks on send: what is never sent is never answered either.
    plain.setsockopt(zmq.SNDTIMEO, 500)
    plain.connect(ref.address)
    try:
        assert fetcher.fetch([ref])[0]["n"] == 3
        with pytest.raises(PayloadsUnavailable):
            stranger.fetch([ref])
        with contextlib.suppress(zmq.Again):
            plain.send(REQUEST.pack(1, ref.key) + ref.store.encode())
        assert not plain.poll(500)
    finally:
        stranger.close()
        plain.close()


def test_a_reader_on_the_same_host_knows_at_once_when_the_holder_is_gone(tmp_path: Path) -> None:
    """No waiting for a dead holder to answer: its store's directory went with it."""
    store = PayloadStore("generate-0", "tcp://127.0.0.1:9", shared_dir=tmp_path)
    kept, freed = store.put(payload(1)), store.put(payload(2))
    store.discard([freed.key])
    reader = PayloadFetcher(
        timeout_s=30.0, max_message_bytes=MAX_BYTES, keys=KEYS, shared_dir=tmp_path
    )
    try:
        with pytest.raises(PayloadsUnavailable) as caught:
            reader.fetch([freed])
        assert "no longer has it" in caught.value.failures[0].reason
        store.close()  # what a killed holder's successor's sweep does
        started = time.monotonic()
        with pytest.raises(PayloadsUnavailable) as caught:
            reader.fetch([kept])
        assert time.monotonic() - started < 10  # not the 30 s a holder is waited for
        assert "store is gone" in caught.value.failures[0].reason
    finally:
        reader.close()


def test_a_sweep_keeps_this_processs_own_stores_unless_told_they_are_left_over(
    tmp_path: Path,
) -> None:
    store = PayloadStore("generate-0", "tcp://127.0.0.1:9", shared_dir=tmp_path)
    store.put(payload(1))
    assert sweep_stale(tmp_path) == 0  # alive: this very process holds it
    assert sweep_stale(tmp_path, mine_too=True) == 1  # at the end of a test session
    assert not list(tmp_path.iterdir())


# --- hostile requests and payloads ---------------------------------------------------------


def test_a_server_answers_every_malformed_request_and_serves_on(
    holder: PayloadStore, fetcher: PayloadFetcher
) -> None:
    ref = holder.put(payload(4))
    asker = zmq.Context.instance().socket(zmq.DEALER)
    asker.setsockopt(zmq.LINGER, 0)
    asker.setsockopt(zmq.CURVE_SERVERKEY, KEYS.public)  # a worker of the run gone astray
    asker.setsockopt(zmq.CURVE_PUBLICKEY, KEYS.public)
    asker.setsockopt(zmq.CURVE_SECRETKEY, KEYS.secret)
    asker.connect(ref.address)
    u64 = st.integers(0, 2**64 - 1)
    store_ids = st.sampled_from([ref.store.encode(), b"", hostile.BAD_UTF8, b"0" * 64, b"0" * 65])
    requests = st.one_of(
        st.lists(st.binary(max_size=90), min_size=1, max_size=3),
        st.builds(lambda r, k, s: [REQUEST.pack(r, k) + s], u64, u64 | st.just(ref.key), store_ids),
    )

    @settings(max_examples=300, deadline=None)
    @given(frames=requests)
    def answered(frames: list[bytes]) -> None:
        asker.send_multipart(frames)
        assert asker.poll(2000), frames
        status, *blob = asker.recv_multipart()
        _, code = REPLY.unpack(status)
        assert code in set(Code) and (code == Code.OK) == bool(blob)

    try:
        answered()
        assert fetcher.fetch([ref])[0]["n"] == 4
    finally:
        asker.close()


def test_a_reader_given_hostile_payloads_reports_each_and_nothing_else(
    holder: PayloadStore, fetcher: PayloadFetcher
) -> None:
    """Payloads whose bytes check out against their references, but are not payloads: a
    str that is not UTF-8, a lying array reference... Each is a FetchFailure, and only
    those that do not decode where they were made."""
    frame_sets = [
        [hostile.packed({"k": 1}, path, raw), *arrays]
        for path in (("k",), (hostile.KEY,))
        for raw in hostile.HOSTILE
        for arrays in ((), (hostile.ARRAY_FRAME,))
    ]
    refs = [holder.put_frames(frames) for frames in frame_sets]
    with pytest.raises(PayloadsUnavailable) as caught:
        fetcher.fetch(refs)
    failed = {f.index for f in caught.value.failures}
    decoding = [hostile.decodes(p.payload_from_frames, frames) for frames in frame_sets]
    assert failed == {i for i, decodes in enumerate(decoding) if not decodes}
    assert all(f.reason.startswith("payload") for f in caught.value.failures)
