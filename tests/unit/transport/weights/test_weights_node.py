"""A process's UCX node: endpoints to peers, and what one unreachable peer may hold up."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from asyncrl.transport.weights.ucx.node import UcxNode, wait

pytestmark = pytest.mark.timeout(60)


class _SlowToWire:
    """A UCX worker whose endpoint to one peer takes as long as the test says, as UCX's
    can while it wires up to a peer behind a cut link; the rest is the real worker."""

    def __init__(self, worker: Any, slow_thread: str) -> None:
        self._worker, self._slow_thread = worker, slow_thread
        self.wiring, self.release = threading.Event(), threading.Event()

    def create_endpoint_from_worker_address(self, *args: Any) -> Any:
        if threading.current_thread().name == self._slow_thread:
            self.wiring.set()
            self.release.wait(30)
        return self._worker.create_endpoint_from_worker_address(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)


def test_a_peer_slow_to_wire_up_holds_up_no_other_peer() -> None:
    node, unreachable, reachable = UcxNode(), UcxNode(), UcxNode()
    slow = _SlowToWire(node._worker, "dialling-the-cut-peer")
    node._worker = slow
    dialling = threading.Thread(
        target=node.endpoint, args=(unreachable.address,), name="dialling-the-cut-peer"
    )
    try:
        dialling.start()
        assert slow.wiring.wait(10)
        got = np.zeros(4, np.uint8)
        received = reachable.recv_any(got, 7)
        done = threading.Event()

        def send() -> None:
            sent = node.send(reachable.address, np.arange(4, dtype=np.uint8), 7)
            if wait(sent, time.monotonic() + 10, "reachable", "send"):
                done.set()

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        assert done.wait(10), "a send to a reachable peer waited for another peer's endpoint"
        assert wait(received, time.monotonic() + 10, "node", "receive")
        assert got.tolist() == [0, 1, 2, 3]
    finally:
        slow.release.set()
        dialling.join(10)
        for n in (node, unreachable, reachable):
            n.close()


def test_two_threads_dialling_one_peer_share_one_endpoint() -> None:
    node, peer = UcxNode(), UcxNode()
    try:
        endpoints: list[Any] = []
        threads = [
            threading.Thread(target=lambda: endpoints.append(node.endpoint(peer.address)))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(endpoints) == 4 and all(ep is endpoints[0] for ep in endpoints)
        assert node.generation(peer.address) == 0
    finally:
        node.close()
        peer.close()
