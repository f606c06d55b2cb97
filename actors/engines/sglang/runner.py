"""One generation engine and the event loop that drives it, on a thread of its own.

SGLang's engine is driven from an asyncio event loop. :class:`EngineRunner` runs that loop
on a thread of its own and keeps the books of every request on it (:mod:`.versions`);
decoders (:mod:`.engine`) hand it work from the worker's thread. A new version goes in
with the engine paused, in flattened buckets (:mod:`.buckets`), and the version changes
in the books between the pause and the continue, so every token reported before it is
the old version's and every token after it the new one's.

The engine is anything with the :class:`GenerationEngine` surface: SGLang's
(:class:`~.engine.SGLangEngine`), or a stand-in in tests.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Protocol

import torch

from .buckets import Bucket, iter_buckets
from .token_versions import Ledger

__all__ = ["DEFAULT_BUCKET_MB", "SETTLE_S", "EngineRunner", "GenerationEngine"]

# After a pause, how long reports already on their way are given to arrive before the
# version changes: the pause stops sampling, not the delivery of what was sampled.
SETTLE_S = 0.02
DEFAULT_BUCKET_MB = 512


class GenerationEngine(Protocol):
    """What the decoder needs of an engine; :class:`~.engine.SGLangEngine` is SGLang's."""

    def generate(
        self, rid: str, input_ids: list[int], sampling_params: dict[str, Any]
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream one request: each item SGLang's output dict (``meta_info`` with
        ``output_token_logprobs`` and, on the last one, ``finish_reason``)."""
        ...

    def abort(self, rid: str) -> None: ...

    async def pause(self) -> None: ...

    async def update(self, bucket: Bucket, version: int, *, last: bool) -> None: ...

    async def resume(self) -> None: ...

    def shutdown(self) -> None: ...


class EngineRunner:
    """One engine, its event loop on a thread of its own, and the books of its requests.

    Everything that touches the ledger or the engine runs on the loop's thread; the
    decoders' methods only post work to it and read their queues.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        *,
        version: int = 0,
        bucket_mb: int = DEFAULT_BUCKET_MB,
        tied_embeddings: bool = False,
        cumulative: bool = True,
        settle_s: float = SETTLE_S,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.engine = engine
        self.ledger = Ledger(version)
        self.bucket_bytes = bucket_mb << 20
        self.tied_embeddings = tied_embeddings
        self.cumulative = cumulative  # how the engine streams: whole response so far, or new
        self.settle_s = settle_s
        # SGLang's engine keeps the loop it was made on, and its requests must run there.
        self.loop = loop or asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sglang", daemon=True)
        self._thread.start()
        self._running = asyncio.Event()  # clear while a version is being loaded
        self.loop.call_soon_threadsafe(self._running.set)
        self._keys = itertools.count()
        self._rids = itertools.count()
        # Each running request's current SGLang id, by its key: a resubmission takes a new one.
        self.rids: dict[int, str] = {}

    @property
    def version(self) -> int:
        return self.ledger.version

    def next_key(self) -> int:
        """A key for one submitted request, unique in this engine over every decoder."""
        return next(self._keys)

    def call(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the loop and wait for its result (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def start(self, coroutine: Any) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def abort(self, keys: Iterable[int]) -> None:
        """Abort these requests in the engine (from any thread)."""
        self.loop.call_soon_threadsafe(self._abort, list(keys))

    def _abort(self, keys: list[int]) -> None:
        for key in keys:
            rid = self.rids.get(key)
            if rid is not None:
                self.engine.abort(rid)

    def next_rid(self) -> str:
        return f"asyncrl-{next(self._rids)}"

    def load(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        self.call(self._load(state, version))

    def close(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)

    async def _load(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        self._running.clear()
        try:
            await self.engine.pause()
            # Reports sampled before the pause may still be on their way: they are the old
            # version's, so they are taken before the version changes.
            await asyncio.sleep(self.settle_s)
            buckets = iter_buckets(state, self.bucket_bytes, tied_embeddings=self.tied_embeddings)
            # One bucket ahead, to know which is the last: the engine flushes its prefix
            # cache once, after it.
            bucket = next(buckets, None)
            while bucket is not None:
                following = next(buckets, None)
                await self.engine.update(bucket, version, last=following is None)
                bucket = following
            self.ledger.update(version)
        finally:
            await self.engine.resume()
            self._running.set()

    async def wait_running(self) -> None:
        await self._running.wait()
