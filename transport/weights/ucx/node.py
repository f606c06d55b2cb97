"""One UCX worker per process, its progress thread, and endpoints to peers by address.

Endpoints are made from worker addresses with UCX's endpoint error handling off: with it
on, UCX restricts itself to transports that can report a dead peer, which on one host
means TCP over loopback (0.5-1 GB/s here) instead of shared memory and cross-memory
attach (4-6 GB/s). Dead peers are found instead by deadlines on our requests and by the
scheduler's heartbeats; a request to a dead peer simply never completes until it is
cancelled (:meth:`UcxNode.drop`).

A node of a local run (``local``) gives UCX the loopback device as its only network
device: its TCP transport then listens on loopback alone, and peers on this host still
meet over shared memory. Otherwise it listens on every interface (..mac says what
guards it there).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np

from .address import publish, to_dial

__all__ = ["Request", "TransferError", "UcxNode", "wait"]

ProgressMode = Literal["thread", "polling"]

_LOOPBACK_DEVICE = "lo"  # Linux's name for it; UCX names network devices by interface

# How long a request that was given up on is kept before it is freed (UcxNode.settle).
_SETTLE_S = 5.0

# A request submitted from Python does not wake a progress thread blocked in epoll
# (measured: such a transfer never completes), so the thread wakes every millisecond.
_EPOLL_TIMEOUT_MS = 1


class TransferError(RuntimeError):
    """A transfer with a peer failed or timed out; the peer is named."""


class Request:
    """A UCX request and the buffer it reads or fills.

    UCX keeps only a pointer to the buffer, and a request may be served well after it was
    submitted (a send on an endpoint still being wired up waits in a queue), so the buffer
    must live at least as long as the request: it travels with it.
    """

    __slots__ = ("_request", "buffer")

    def __init__(self, request: Any, buffer: np.ndarray) -> None:
        self._request, self.buffer = request, buffer

    @property
    def completed(self) -> bool:
        return bool(self._request.completed)

    def check_error(self) -> None:
        self._request.check_error()


class UcxNode:
    """This process's UCX worker. Thread-safe: request submission is serialised."""

    def __init__(self, progress_mode: ProgressMode = "thread", *, local: bool = True) -> None:
        # ucxx sets UCX variables that this UCX build does not know, and UCX warns about
        # each in every process; the variables are harmless.
        os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        # Imported here: only the processes that move weights pay for loading UCX.
        import ucxx._lib.libucxx as ucx
        from ucxx._lib.arr import Array

        self._ucx, self._array = ucx, Array
        # Over the environment's UCX_NET_DEVICES, which would otherwise open it again.
        config = {"NET_DEVICES": _LOOPBACK_DEVICE} if local else {}
        context = ucx.UCXContext(config, feature_flags=(ucx.Feature.TAG, ucx.Feature.WAKEUP))
        self._worker = ucx.UCXWorker(context)
        if progress_mode == "polling":
            self._worker.start_progress_thread(polling_mode=True)
        elif progress_mode == "thread":
            self._worker.start_progress_thread(polling_mode=False, epoll_timeout=_EPOLL_TIMEOUT_MS)
        else:
            raise ValueError(f"progress_mode={progress_mode!r}: expected 'thread' or 'polling'")
        self._context = context
        # Which UCX address a peer dials depends on whether it shares this host.
        self.address: bytes = publish(self._worker)
        self._endpoints: dict[bytes, Any] = {}
        self._making: dict[bytes, threading.Lock] = {}  # held while an endpoint is made
        self._generations: dict[bytes, int] = {}  # endpoints made to each address so far
        self._peer_generations: dict[bytes, int] = {}  # what each peer last said of its own
        self._settling: list[tuple[float, Request]] = []  # (freed after, request): settle()
        self._lock = threading.Lock()
        self._closed = False

    def endpoint(self, address: bytes) -> Any:
        with self._lock:
            ep = self._endpoints.get(address)
            if ep is not None:
                return ep
            making = self._making.setdefault(address, threading.Lock())
        # Made outside the node's lock: UCX may wait on the peer while it wires an endpoint
        # up, and a peer behind a cut link must not hold up every other peer's requests.
        # One maker per address, so that two threads never make two endpoints to one peer.
        with making:
            with self._lock:
                ep = self._endpoints.get(address)
            if ep is not None:
                return ep
            peer = self._ucx.UCXAddress.create_from_buffer(to_dial(address))
            ep = self._worker.create_endpoint_from_worker_address(peer, False)
            with self._lock:
                self._endpoints[address] = ep
                self._generations[address] = self._generations.get(address, -1) + 1
            return ep

    def generation(self, address: bytes) -> int:
        """How many times the endpoint to ``address`` was made again (0: the first one)."""
        with self._lock:
            return self._generations.get(address, 0)

    def peer_generation(self, address: bytes, generation: int) -> None:
        """The peer at ``address`` talks to us over its endpoint ``generation``.

        When it made a new one, ours to it is stale (it delivers no rendezvous message any
        more): close it, so the next send makes a fresh one. Ours may be gone already
        (dropped after a send to the peer timed out, as when its link was cut).
        """
        with self._lock:
            known = self._peer_generations.get(address)
            self._peer_generations[address] = generation
            stale = known not in (None, generation)
            ep = self._endpoints.pop(address, None) if stale else None
        if ep is not None:
            _close(ep)

    def drop(self, address: bytes, generation: int | None = None) -> None:
        """Close the endpoint to ``address``, cancelling its requests in flight at once.

        With ``generation``, only if the endpoint is still that one: a request that failed
        on an endpoint since replaced must not take its successor down with it.
        """
        with self._lock:
            if generation is not None and self._generations.get(address) != generation:
                return
            ep = self._endpoints.pop(address, None)
        if ep is not None:
            _close(ep)

    def settle(self, requests: Iterable[Request]) -> None:
        """Keep ``requests`` until they have ended, for at most a few seconds.

        Freeing a request still in flight cancels it from inside the deallocator, which
        holds the interpreter lock while it waits for UCX's worker lock; the progress
        thread may hold that one while it waits for the interpreter lock: a deadlock, seen
        after a corrupt bucket was given up. A receive whose bytes were already under way
        cannot be cancelled at all, and ends only once its dead peer is found out; its
        fetch must not wait for that. So requests a caller is done with end here.
        """
        now = time.monotonic()
        pending = [(now + _SETTLE_S, r) for r in requests if not r.completed]
        with self._lock:
            kept, self._settling = self._settling, []
            for freed_after, request in kept:
                if not request.completed and now < freed_after:
                    self._settling.append((freed_after, request))
            self._settling.extend(pending)
        del kept  # the ended ones are freed here, outside the node's lock

    def send(self, address: bytes, data: np.ndarray, tag: int) -> Request:
        ep = self.endpoint(address)
        with self._lock:
            return Request(ep.tag_send(self._array(data), self._ucx.UCXXTag(tag)), data)

    def recv(self, address: bytes, into: np.ndarray, tag: int) -> Request:
        ep = self.endpoint(address)
        with self._lock:
            return Request(ep.tag_recv(self._array(into), self._ucx.UCXXTag(tag)), into)

    def recv_any(self, into: np.ndarray, tag: int) -> Request:
        """Receive a message with ``tag`` from any peer."""
        with self._lock:
            return Request(self._worker.tag_recv(self._array(into), self._ucx.UCXXTag(tag)), into)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            endpoints = list(self._endpoints.values())
            self._endpoints.clear()
        for ep in endpoints:
            _close(ep)
        self._worker.stop_progress_thread()


def _close(endpoint: Any) -> None:
    """Cancel ``endpoint``'s requests in flight, then close it.

    Closing alone cancels them only once UCX has flushed the endpoint, which a peer that
    died or sits behind a cut link never lets happen over TCP (measured between two hosts:
    receives still posted 15 s later). Cancelling first ends them within milliseconds, so
    a fetch from a dead source moves on at its own deadline and no later.
    """
    cancel = _cancel_inflight_requests()
    if cancel is not None:
        cancel(endpoint.ucxx_ptr)
    endpoint.close()


@functools.cache
def _cancel_inflight_requests() -> Any:
    """libucxx's ``Endpoint::cancelInflightRequests()``, which its Python binding lacks;
    None where the library does not export it (closing then cancels as UCX flushes)."""
    import libucxx

    try:
        function = libucxx.load_library()._ZN4ucxx8Endpoint22cancelInflightRequestsEv
    except (AttributeError, OSError):
        return None
    function.restype, function.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    return function


def wait(request: Request, deadline: float, peer: str, what: str) -> bool:
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
