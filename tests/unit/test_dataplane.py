"""The data plane's store, server and fetcher, over real ZeroMQ sockets in one process."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from asyncrl.transport import protocol as p
from asyncrl.transport.dataplane import (
    PayloadFetcher,
    PayloadServer,
    PayloadStore,
    PayloadsUnavailable,
)
from asyncrl.transport.security import ClientKeys, keygen, load_client_keys

MAX_BYTES = 64 << 20


@pytest.fixture
def holder():
    store = PayloadStore("generate-0")
    server = PayloadServer(store, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES)
    yield store
    server.close()


@pytest.fixture
def fetcher():
    fetcher = PayloadFetcher(timeout_s=2.0, max_message_bytes=MAX_BYTES)
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
    server = PayloadServer(other, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES)
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
    holder._blobs[ref.key] = bytes(reversed(holder._blobs[ref.key]))  # rotted at rest
    with pytest.raises(PayloadsUnavailable) as caught:
        fetcher.fetch([ref])
    assert "checksum" in caught.value.failures[0].reason
    assert fetcher.refetched == 1  # asked once more before giving up


def test_a_dead_holder_times_out_and_its_socket_is_dropped(fetcher: PayloadFetcher) -> None:
    store = PayloadStore("generate-1")
    server = PayloadServer(store, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES)
    ref = store.put(payload(1))
    server.close()
    fetcher.timeout_s = 0.3
    with pytest.raises(PayloadsUnavailable) as caught:
        fetcher.fetch([ref])
    assert "did not answer in 0.3s" in caught.value.failures[0].reason
    assert ref.address not in fetcher._sockets


def test_store_reports_only_acknowledged_keys_and_tracks_bytes() -> None:
    store = PayloadStore("w")
    a, b = store.put_blob(b"x" * 100), store.put_blob(b"y" * 50)
    assert store.acknowledged() == ()
    store.acknowledge([a.key])
    assert store.acknowledged() == (a.key,)
    assert store.stats().bytes == 150
    assert store.discard([a.key, b.key, 999]) == 150
    stats = store.stats()
    assert (stats.payloads, stats.bytes, stats.peak_bytes) == (0, 0, 150)
    assert store.acknowledged() == ()


def test_curve_admits_the_runs_workers_only(tmp_path) -> None:
    keygen(tmp_path)
    keys = load_client_keys(tmp_path)
    store = PayloadStore("generate-0")
    server = PayloadServer(store, "tcp://127.0.0.1:0", max_message_bytes=MAX_BYTES, keys=keys)
    ref = store.put(payload(3))
    member = PayloadFetcher(timeout_s=2.0, max_message_bytes=MAX_BYTES, keys=keys)
    keygen(tmp_path / "other")
    other = load_client_keys(tmp_path / "other")
    # Knows the holder's public key, but is not the run's worker key pair.
    stranger_keys = ClientKeys(other.public, other.secret, server_public=keys.public)
    stranger = PayloadFetcher(timeout_s=0.5, max_message_bytes=MAX_BYTES, keys=stranger_keys)
    plain = PayloadFetcher(timeout_s=0.5, max_message_bytes=MAX_BYTES)
    try:
        assert member.fetch([ref])[0]["n"] == 3
        for outsider in (stranger, plain):
            with pytest.raises(PayloadsUnavailable):
                outsider.fetch([ref])
    finally:
        for f in (member, stranger, plain):
            f.close()
        server.close()
