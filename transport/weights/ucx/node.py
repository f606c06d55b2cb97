"""One UCX worker per process, its progress thread, and endpoints to peers by address.

Endpoints are made from worker addresses with UCX's endpoint error handling off: with it
on, UCX restricts itself to transports that can report a dead peer, which on one host
means TCP over loopback (0.5-1 GB/s here) instead of shared memory and cross-memory
attach (4-6 GB/s). Dead peers are found instead by deadlines on our requests and by the
scheduler's heartbeats; a request to a dead peer simply never completes, and closing its
endpoint cancels it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Literal

import numpy as np

__all__ = ["TransferError", "UcxNode", "wait"]

ProgressMode = Literal["thread", "polling"]

# A request submitted from Python does not wake a progress thread blocked in epoll
# (measured: such a transfer never completes), so the thread wakes every millisecond.
_EPOLL_TIMEOUT_MS = 1


class TransferError(RuntimeError):
    """A transfer with a peer failed or timed out; the peer is named."""


class UcxNode:
    """This process's UCX worker. Thread-safe: request submission is serialised."""

    def __init__(self, progress_mode: ProgressMode = "thread") -> None:
        # ucxx sets UCX variables that this UCX build does not know, and UCX warns about
        # each in every process; the variables are harmless.
        os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        # Imported here: only the processes that move weights pay for loading UCX.
        import ucxx._lib.libucxx as ucx
        from ucxx._lib.arr import Array

        self._ucx, self._array = ucx, Array
        context = ucx.UCXContext(feature_flags=(ucx.Feature.TAG, ucx.Feature.WAKEUP))
        self._worker = ucx.UCXWorker(context)
        if progress_mode == "polling":
            self._worker.start_progress_thread(polling_mode=True)
        elif progress_mode == "thread":
            self._worker.start_progress_thread(polling_mode=False, epoll_timeout=_EPOLL_TIMEOUT_MS)
        else:
            raise ValueError(f"progress_mode={progress_mode!r}: expected 'thread' or 'polling'")
        self._context = context
        self.address: bytes = bytes(self._worker.address.tobytes())
        self._endpoints: dict[bytes, Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    def endpoint(self, address: bytes) -> Any:
        with self._lock:
            ep = self._endpoints.get(address)
            if ep is None:
                peer = self._ucx.UCXAddress.create_from_buffer(address)
                ep = self._worker.create_endpoint_from_worker_address(peer, False)
                self._endpoints[address] = ep
            return ep

    def drop(self, address: bytes) -> None:
        """Close the endpoint to ``address``: its requests in flight are cancelled."""
        with self._lock:
            ep = self._endpoints.pop(address, None)
            if ep is not None:
                ep.close()

    def send(self, address: bytes, data: np.ndarray, tag: int) -> Any:
        ep = self.endpoint(address)
        with self._lock:
            return ep.tag_send(self._array(data), self._ucx.UCXXTag(tag))

    def recv(self, address: bytes, into: np.ndarray, tag: int) -> Any:
        ep = self.endpoint(address)
        with self._lock:
            return ep.tag_recv(self._array(into), self._ucx.UCXXTag(tag))

    def recv_any(self, into: np.ndarray, tag: int) -> Any:
        """Receive a message with ``tag`` from any peer."""
        with self._lock:
            return self._worker.tag_recv(self._array(into), self._ucx.UCXXTag(tag))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            for ep in self._endpoints.values():
                ep.close()
            self._endpoints.clear()
        self._worker.stop_progress_thread()


def wait(request: Any, deadline: float, peer: str, what: str) -> bool:
    """Wait for ``request`` until ``deadline`` (monotonic); False if it timed out.

    A request that completed with an error raises :class:`TransferError`.
    """
    pause = 1e-5
    while not request.completed:
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 5e-4)
    try:
        request.check_error()
    except Exception as error:  # ucxx raises its own error classes per status
        raise TransferError(f"{what} with {peer} failed: {error}") from error
    return True
