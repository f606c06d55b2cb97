"""A worker's end of the data plane: leases in with their payloads, results out as references.

Role code never sees a reference. Before an actor gets a lease, :meth:`WorkerPayloads.resolve`
fetches every payload its items reference and puts them into ``data``, as if they had come
inline; after the actor is done, :meth:`WorkerPayloads.stash` keeps each result's payload
in this worker's store and sends a reference instead, unless it is small enough that a
reference would cost more than the bytes (``inline_bytes``).

A key is reported to the scheduler as held (Held) only once the completion that refers to
it was answered, so the scheduler never frees what it has not journaled yet; the answer to
Held (Drop) names the keys no live group refers to, a refused completion's among them.
"""

from __future__ import annotations

import functools
import secrets
import threading
from collections.abc import Sequence
from urllib.parse import urlsplit

from asyncrl.transport import protocol as p
from asyncrl.transport.dataplane import (
    PayloadFetcher,
    PayloadServer,
    PayloadStore,
    PayloadsUnavailable,
    StoreFull,
    image,
)
from asyncrl.transport.dataplane.store import default_shared_dir
from asyncrl.transport.host import route_source
from asyncrl.transport.security import ClientKeys, payload_keys
from asyncrl.transport.sockets import tcp_endpoint

__all__ = ["LostPayloads", "WorkerPayloads", "in_process_keys", "serving_host"]


class LostPayloads(Exception):
    """A lease's payloads could not all be fetched; ``lost`` says which, for a Fail."""

    def __init__(self, lost: Sequence[p.LostPayload]) -> None:
        self.lost = tuple(lost)
        first = self.lost[0]
        super().__init__(
            f"{len(self.lost)} payload(s) unavailable, first {first.role} of group "
            f"{first.gid}: {first.reason}"
        )


class WorkerPayloads:
    """The store, its server (bound on first use) and the fetcher of one worker process."""

    def __init__(
        self,
        worker: str,
        *,
        host: str,
        inline_bytes: int,
        fetch_timeout_s: float,
        max_message_bytes: int,
        keys: ClientKeys,
        shared_memory: bool = True,
    ) -> None:
        shared_dir = default_shared_dir() if shared_memory else None
        self.store = PayloadStore(worker, shared_dir=shared_dir)
        self.inline_bytes = inline_bytes
        self._endpoint = tcp_endpoint(host, 0)  # a free port
        self._max_message_bytes = max_message_bytes
        self._keys = keys
        self._server: PayloadServer | None = None
        self._keys_of: dict[int, list[int]] = {}  # gid -> the keys kept for it
        self._lock = threading.Lock()  # _keys_of: stashed by the main thread, pruned by beats
        self.fetcher = PayloadFetcher(
            timeout_s=fetch_timeout_s,
            max_message_bytes=max_message_bytes,
            keys=keys,
            shared_dir=shared_dir,
        )

    # --- leases in -------------------------------------------------------------------

    def resolve(self, lease: p.Lease) -> p.Lease:
        """``lease`` with every referenced payload fetched into its items' ``data``."""
        wanted = [
            (i, role, ref) for i, it in enumerate(lease.items) for role, ref in it.refs.items()
        ]
        if not wanted:
            return lease
        try:
            payloads = self.fetcher.fetch([ref for _, _, ref in wanted])
        except PayloadsUnavailable as missing:
            raise LostPayloads(
                [
                    p.LostPayload(lease.items[wanted[f.index][0]].gid, wanted[f.index][1], f.reason)
                    for f in missing.failures
                ]
            ) from None
        data = [dict(item.data) for item in lease.items]
        for (index, role, _), payload in zip(wanted, payloads, strict=True):
            data[index][role] = payload
        items = tuple(
            p.Item(item.gid, item.key, merged)
            for item, merged in zip(lease.items, data, strict=True)
        )
        return p.Lease(
            lease.lease_id, lease.fence, lease.role, lease.expires_in_s, lease.version, items
        )

    # --- results out -----------------------------------------------------------------

    def stash(self, results: Sequence[p.Result]) -> tuple[tuple[p.Result, ...], tuple[int, ...]]:
        """``results`` with large payloads kept here and referenced; the keys kept.

        StoreFull if one does not fit: what this call kept already is freed again."""
        out: list[p.Result] = []
        keys: list[int] = []
        for result in results:
            frames = p.payload_frames(result.data) if result.data else []
            if not frames or image.size_of(frames) <= self.inline_bytes:
                out.append(result)
                continue
            self._serve()
            try:
                ref = self.store.put_frames(frames)
            except StoreFull:
                self.store.discard(keys)
                raise
            keys.append(ref.key)
            with self._lock:
                self._keys_of.setdefault(result.gid, []).append(ref.key)
            out.append(p.Result(result.gid, {}, result.behaviour, ref, result.filtered))
        return tuple(out), tuple(keys)

    def settled(self, keys: Sequence[int]) -> None:
        """The scheduler answered the completion referring to ``keys``: from now on they
        are reported as held, and freed once it answers that no group refers to them."""
        self.store.acknowledge(keys)

    # --- freeing ---------------------------------------------------------------------

    def held(self, worker: str) -> p.Held | None:
        """What to ask the scheduler about, or None when nothing acknowledged is kept."""
        keys = self.store.acknowledged()
        if not keys:
            return None
        return p.Held(worker, self.store.store_id, keys, self.store.stats().bytes)

    def drop(self, keys: Sequence[int]) -> int:
        """Free what the scheduler no longer refers to (its answer to Held)."""
        freed = self.store.discard(keys)
        kept = self.store.keys()
        with self._lock:  # forget groups whose finish event never came
            for gid in [g for g, ks in self._keys_of.items() if kept.isdisjoint(ks)]:
                del self._keys_of[gid]
        return freed

    def finished(self, gids: Sequence[int]) -> int:
        """Groups left the pipeline (trained or dead): nobody reads their payloads again."""
        with self._lock:
            keys = [key for gid in gids for key in self._keys_of.pop(gid, ())]
        return self.store.discard(keys) if keys else 0

    def close(self) -> None:
        self.fetcher.close()
        if self._server is not None:
            self._server.close()
        self.store.close()

    def _serve(self) -> None:
        if self._server is None:  # roles that never keep a payload never bind a port
            self._server = PayloadServer(
                self.store,
                self._endpoint,
                max_message_bytes=self._max_message_bytes,
                keys=self._keys,
            )


@functools.cache
def in_process_keys() -> ClientKeys:
    """A payload key pair for workers that share this process (tests, in-process runs):
    drawn once, known to nobody outside it."""
    return payload_keys(secrets.token_bytes(32))


def serving_host(scheduler_endpoint: str, configured: str = "") -> str:
    """The address this worker's payloads are served on: ``configured``, or the local
    address the OS routes to the scheduler by (loopback for a local run)."""
    if configured:
        return configured
    parts = urlsplit(scheduler_endpoint)
    if parts.scheme != "tcp" or not parts.hostname:
        return "127.0.0.1"  # ipc:// and inproc:// schedulers live on this host
    return route_source(parts.hostname, parts.port or 1)
