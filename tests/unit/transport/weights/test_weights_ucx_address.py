"""A weight-plane address: a peer on this host is dialled at the worker's full UCX
address, a peer elsewhere at its network one; bytes that are no address are refused."""

from __future__ import annotations

import msgpack
import pytest

from asyncrl.transport.host import host_identity
from asyncrl.transport.weights.ucx.address import BadAddress, to_dial
from asyncrl.transport.weights.ucx.node import UcxNode


def test_this_host_dials_the_full_address_another_the_network_one() -> None:
    here = msgpack.packb([host_identity(), b"full", b"network"])
    elsewhere = msgpack.packb([f"{host_identity()}-another-shm", b"full", b"network"])
    assert to_dial(here) == b"full"
    assert to_dial(elsewhere) == b"network"


@pytest.mark.parametrize(
    "address",
    [b"", b"\xc1", msgpack.packb(7), msgpack.packb(["h", b"a"]), msgpack.packb([1, 2, 3])],
)
def test_what_is_no_address_is_refused_saying_so(address: bytes) -> None:
    with pytest.raises(BadAddress, match="not a weight-plane address"):
        to_dial(address)


def test_a_worker_publishes_both_and_either_makes_an_endpoint() -> None:
    node = UcxNode()
    try:
        host, full, network = msgpack.unpackb(node.address)
        assert host == host_identity() and 0 < len(network) < len(full)
        node.endpoint(node.address)  # its full address: this host
        other = msgpack.packb(["another host", full, network])
        node.endpoint(other)  # its network address: made from TCP's devices alone
    finally:
        node.close()
