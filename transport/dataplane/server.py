"""Serving a store's payloads: a ROUTER on a thread of its own.

The thread only looks keys up and sends the blobs zero-copy, so serving costs the worker's
main thread (decoding, training) nothing but the interpreter lock for a few microseconds
per fetch. The server always speaks CURVE, with the run's payload key pair
(security.payload_keys), and admits only that key: every worker of the run, nobody else.
On loopback too: a port on 127.0.0.1 is open to every user of the machine, and a
reference (holder, store, key) is no secret, so the key is what keeps others out. One
mechanism for every deployment (one host, many, pods), where an ipc:// socket in a
private directory would serve only readers on the holder's host, and those map the
payload from shared memory anyway.
"""

from __future__ import annotations

import threading

import structlog
import zmq

from .._handshakes import ZAP_DOMAINS, CurveGuard
from ..security import ClientKeys
from .store import PayloadStore
from .wire import MAX_STORE_ID, REPLY, REQUEST, Code

__all__ = ["PayloadServer"]

log = structlog.get_logger("asyncrl.dataplane")

_ZAP_DOMAIN = ZAP_DOMAINS["payloads"]
_POLL_MS = 100  # how soon the thread notices close()
_LINGER_MS = 100


class PayloadServer:
    """Serves ``store`` at ``endpoint`` (``tcp://HOST:0`` picks a free port) until closed."""

    def __init__(
        self,
        store: PayloadStore,
        endpoint: str,
        *,
        max_message_bytes: int,
        keys: ClientKeys,
    ) -> None:
        self.store = store
        self._ctx = zmq.Context()  # its own: one authenticator per context
        self._guard = CurveGuard(self._ctx, frozenset({keys.public}))
        self._socket = self._ctx.socket(zmq.ROUTER)
        try:
            self._socket.setsockopt(zmq.LINGER, _LINGER_MS)
            self._socket.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
            self._socket.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a gone consumer is no error
            self._socket.setsockopt(zmq.CURVE_SERVER, 1)
            self._socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
            self._socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
            self._socket.setsockopt(zmq.ZAP_DOMAIN, _ZAP_DOMAIN)
            if endpoint.startswith("tcp://["):
                self._socket.setsockopt(zmq.IPV6, 1)
            self._socket.bind(endpoint)
            self.address = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        except BaseException:
            self._close_sockets()
            raise
        store.address = self.address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="payload-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._socket.close()
        self._guard.stop()
        self._ctx.term()

    def _serve(self) -> None:
        socket, store = self._socket, self.store
        while not self._stop.is_set():
            if not socket.poll(_POLL_MS):
                continue
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    reply = _answer(store, frames)
                except Exception:  # a bug: this request is refused, the server goes on
                    log.exception("payload request failed", frames=len(frames))
                    reply = [REPLY.pack(0, Code.MALFORMED)]
                socket.send_multipart([frames[0].bytes, *reply], copy=False)


def _answer(store: PayloadStore, frames: list[zmq.Frame]) -> list[bytes]:
    if len(frames) != 2 or not REQUEST.size <= len(frames[1]) <= REQUEST.size + MAX_STORE_ID:
        log.warning("malformed payload request", frames=len(frames))
        return [REPLY.pack(0, Code.MALFORMED)]
    header = frames[1].bytes
    req_id, key = REQUEST.unpack_from(header)
    if header[REQUEST.size :] != store.store_id.encode():
        return [REPLY.pack(req_id, Code.UNKNOWN_STORE)]
    blob = store.get(key)
    if blob is None:
        return [REPLY.pack(req_id, Code.UNKNOWN_KEY)]
    return [REPLY.pack(req_id, Code.OK), blob]
