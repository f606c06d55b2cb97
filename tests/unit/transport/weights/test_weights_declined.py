"""A source that holds no such version says so, and the asker is free to ask for another
source at once: over TCP (the transport between hosts) as over shared memory on one host.

Closing an endpoint over TCP cancels the receives posted on it only after seconds, so a
source that says no ends them itself (an empty body); the asker then has nothing to wait
for. Before, a generator planned under a relay on the trainer's host (which maps the
trainer's files, and so holds nothing to serve) waited 5 s for its receives to settle.
"""

from __future__ import annotations

import time

import pytest

from asyncrl.transport.weights.base import NeedsPlan, Received, WeightsPlan
from asyncrl.transport.weights.ucx import UcxPublisher, UcxReceiver
from tests.unit.transport.weights.test_weights_shm import receive, state

QUICKLY_S = 2.0  # well under the 5 s a declined fetch took over TCP


@pytest.mark.parametrize("transports", ["tcp,self", ""], ids=["tcp", "any"])
def test_a_relay_without_the_version_sends_the_asker_elsewhere_at_once(
    transports: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if transports:
        monkeypatch.setenv("UCX_TLS", transports)  # read as each node's UCX context is made
    publisher = UcxPublisher(bucket_mb=1 / 1024)
    relay = UcxReceiver(bucket_mb=1 / 1024)  # planned as a relay, it never fetches
    asker = UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=5)
    try:
        manifest = publisher.publish(1, state(1)).manifest
        started = time.monotonic()
        got = receive(asker, WeightsPlan(1, manifest, "relay", relay.address))
        took = time.monotonic() - started
        assert isinstance(got, NeedsPlan) and got.failed == "relay", got
        assert "version 1 not held" in got.reason
        assert took < QUICKLY_S, f"the asker took {took:.2f} s to give the relay up"
        got = receive(asker, WeightsPlan(1, manifest, "trainer", publisher.address))
        assert isinstance(got, Received) and got.source == "trainer"
        assert got.attempts == 2
    finally:
        for node in (asker, relay, publisher):
            node.close()
