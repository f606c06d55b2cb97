"""The group's store (transport/group_store.py) on real sockets, in one process: it serves
the run's key only, holds what its bounds allow, and says at once when its server is gone.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from asyncrl.transport.group_store import (
    GroupStoreClient,
    GroupStoreError,
    GroupStoreServer,
    Limits,
    StoreGone,
    StoreRefused,
    StoreTimeout,
    _curve_pair,
)
from tests.support.ranks import free_port

pytestmark = pytest.mark.timeout(60)

SECRET = secrets.token_bytes(32)


@pytest.fixture
def served():
    port = free_port()
    server = GroupStoreServer("127.0.0.1", port, SECRET, Limits(1000, 2500, 8))
    client = GroupStoreClient("127.0.0.1", port, SECRET, timeout_s=10)
    yield server, client, port
    client.close()
    server.close()


def test_the_store_keeps_torchs_semantics(served) -> None:
    _, client, _ = served
    client.call("set", "a", b"1")
    assert client.call("get", ["a"], 1.0, waits_s=1.0) == b"1"
    assert client.call("add", "n", 2) == 2 and client.call("add", "n", 3) == 5
    assert client.call("get", ["n"], 1.0, waits_s=1.0) == b"5"  # a counter is its text
    assert client.call("compare_set", "c", b"", b"x") == b"x"  # absent and expected empty
    assert client.call("compare_set", "c", b"y", b"z") == b"x"  # not as expected: kept
    assert client.call("check", ["a", "c"]) and not client.call("check", ["a", "b"])
    assert client.call("delete", "a") and not client.call("delete", "a")
    assert client.call("num_keys") == 2
    with pytest.raises(StoreTimeout):
        client.call("wait", ["b"], 0.2, waits_s=0.2)


def test_a_wait_ends_when_another_rank_sets_the_key(served) -> None:
    _, client, port = served
    other = GroupStoreClient("127.0.0.1", port, SECRET, timeout_s=10)
    threading.Timer(0.3, lambda: other.call("set", "late", b"v")).start()
    started = time.monotonic()
    assert client.call("get", ["late"], 10.0, waits_s=10.0) == b"v"
    assert time.monotonic() - started < 5
    other.close()


def test_what_the_store_holds_is_bounded_and_it_serves_on(served) -> None:
    server, client, _ = served
    with pytest.raises(GroupStoreError, match="1000 at most"):
        client.call("set", "big", bytes(1001))
    client.call("set", "a", bytes(990))
    client.call("set", "b", bytes(990))
    with pytest.raises(GroupStoreError, match="2500 bytes at most"):
        client.call("set", "c", bytes(990))
    client.call("set", "a", b"")  # replacing a value frees its room
    client.call("set", "c", bytes(990))
    for n in range(5):
        client.call("set", f"k{n}", b"")
    with pytest.raises(GroupStoreError, match="8 keys at most"):
        client.call("set", "one-too-many", b"")
    assert server.table.size <= 2500 and client.call("get", ["c"], 1.0, waits_s=1.0)


def test_a_client_without_the_run_secret_is_refused(served) -> None:
    _, _, port = served
    stranger = GroupStoreClient("127.0.0.1", port, secrets.token_bytes(32), timeout_s=10)
    with pytest.raises(StoreRefused, match="run secret"):
        stranger.call("get", ["a"], 1.0, waits_s=1.0)
    stranger.close()


def test_knowing_the_servers_public_key_is_not_enough(served) -> None:
    """A client with the server's public key (as if it had leaked) and a key of its own is
    turned away by the authenticator: only the key derived from the run secret gets in."""
    server, _, port = served
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    own_public, own_secret = zmq.curve_keypair()
    dealer.curve_serverkey = _curve_pair(SECRET, b"server")[0]
    dealer.curve_publickey, dealer.curve_secretkey = own_public, own_secret
    dealer.linger = 0
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send(msgpack.packb([0, "get", ["a"], 0.0]))
    assert not dealer.poll(1000)
    assert server.refused >= 1
    dealer.close()
    context.term()


@pytest.mark.parametrize(
    "request_",
    [
        [1, "set"],  # no key, no value
        [1, "set", 7, b""],  # a key that is no text
        [1, "set", "k", "text"],  # a value that is no bytes
        [1, "wait", ["k"], float("nan")],
        [1, "wait", ["k"], 1e12],
        [1, "add", "k", "x"],
        [1, "drop_everything"],
    ],
)
def test_a_malformed_request_gets_an_error_and_the_store_serves_on(served, request_) -> None:
    _, client, _ = served
    with pytest.raises(GroupStoreError):
        client.call(*request_[1:])
    client.call("set", "still", b"here")
    assert client.call("get", ["still"], 1.0, waits_s=1.0) == b"here"


def test_garbage_on_the_port_leaves_the_store_serving(served) -> None:
    _, client, port = served
    with socket.create_connection(("127.0.0.1", port)) as raw:
        raw.sendall(b"\x00" * 64 + bytes(range(256)))  # torch's own client says this kind
    client.call("set", "still", b"here")
    assert client.call("get", ["still"], 1.0, waits_s=1.0) == b"here"


def test_a_client_hears_at_once_that_the_server_is_gone() -> None:
    port = free_port()
    server = GroupStoreServer("127.0.0.1", port, SECRET)
    client = GroupStoreClient("127.0.0.1", port, SECRET, timeout_s=30)
    client.call("set", "a", b"")
    threading.Timer(0.3, server.close).start()
    started = time.monotonic()
    with pytest.raises(StoreGone):
        client.call("wait", ["never"], 20.0, waits_s=20.0)
    assert time.monotonic() - started < 10  # not the wait's 20 s, nor the timeout's 30
    client.close()


def _listening(port: int) -> list[str]:
    """The local addresses (as /proc/net writes them) of the sockets listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and local.endswith(f":{port:04X}"):  # 0A: LISTEN
                found.append(local.rpartition(":")[0])
    return found


def test_the_store_listens_on_its_address_only() -> None:
    port = free_port()
    server = GroupStoreServer("127.0.0.1", port, SECRET)
    try:
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, not 0.0.0.0 nor ::
    finally:
        server.close()
