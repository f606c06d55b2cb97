"""A group's harness sessions, run on an asyncio loop of the harness worker's own.

A harness is a plain async function ``run(sample, client) -> reward`` written against the
official ``openai`` client. For each of a group's ``data.group_size`` trajectories the
runner binds an ``AsyncOpenAI`` client to a fresh session on one of the live generators
(the session id is in its ``base_url``), awaits the harness under
``data.harness_timeout_s``, collects what the session's calls sampled from that
generator, and merges it into sequences (:mod:`.merge`). The group's trajectories run
concurrently; at most ``data.harness_concurrency`` sessions run at once per worker.

A session that raises, outlives its time, returns a non-number or makes no model call
fails its group with the reason (:class:`HarnessFailed`), and the group's other sessions
are cancelled; the worker gives the group back with that reason. Nothing a harness does
reaches the generators but HTTP calls, so a harness that hangs holds up its own session
only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import math
import numbers
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import openai

from ..payloads import Sampled
from ..tasks import Sample, TaskError
from ..tasks.base import import_path
from .call_records import CallRecord, decode_records
from .directory import ApiEntry
from .merge import merge_calls

__all__ = ["HarnessFailed", "HarnessFunction", "SessionRunner", "load_harness"]

HarnessFunction = Callable[[Sample, openai.AsyncOpenAI], Awaitable[Any]]

_COLLECT_S = 10.0  # to fetch a session's records from its generator
_NO_SERVER_POLL_S = 0.05  # how often a session waiting for a live generator looks again


class HarnessFailed(Exception):
    """A session of the group failed; the message is the group's reason."""


def load_harness(path: str) -> HarnessFunction:
    """``data.harness``'s function; TaskError naming the key if it is not one."""
    function = import_path(path, "data.harness")
    if not asyncio.iscoroutinefunction(function):
        raise TaskError(
            f"data.harness={path!r}: not an async function (expected async def run(sample, "
            "client) -> reward)"
        )
    return function


class SessionRunner:
    """Runs groups of harness sessions on a loop of its own thread.

    ``servers()`` gives the generators a session may use now (called on the loop's thread;
    it must be safe from there).
    """

    def __init__(
        self,
        function: HarnessFunction,
        name: str,
        *,
        timeout_s: float,
        concurrency: int,
        servers: Callable[[], list[ApiEntry]],
    ) -> None:
        self.function, self.name, self.timeout_s = function, name, timeout_s
        self.servers = servers
        self._turn = itertools.count()  # round robin over the live generators
        self.loop = asyncio.new_event_loop()
        # One connection pool for every session's client: making a client with a pool of
        # its own costs about 30 ms of CPU (measured here), more than a call to a small model.
        self._http: Any = None  # made on the loop, at the first session
        self._limit = asyncio.Semaphore(concurrency)
        self._thread = threading.Thread(target=self.loop.run_forever, name="harness-sessions")
        self._thread.daemon = True  # a harness stuck in blocking code cannot keep us alive
        self._thread.start()

    def run_group(
        self, sample: Sample, n: int, session_prefix: str
    ) -> concurrent.futures.Future[tuple[list[Sampled], list[float]]]:
        """Start ``n`` sessions of ``sample``; the future gives every trajectory's
        sequences and the rewards, or raises HarnessFailed with the reason."""
        group = self._group(sample, n, session_prefix)
        return asyncio.run_coroutine_threadsafe(group, self.loop)

    def run_validation(
        self, samples: list[Sample], session_prefix: str
    ) -> concurrent.futures.Future[list[float | str]]:
        """Each sample once, on validation sessions (greedy calls, nothing recorded): per
        sample its reward, or why its session failed."""
        return asyncio.run_coroutine_threadsafe(self._validate(samples, session_prefix), self.loop)

    def stop(self) -> None:
        """Cancel every session and end the loop."""

        def cancel_all() -> None:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            if self._http is not None:
                self.loop.create_task(self._http.aclose())
            self.loop.call_soon(self.loop.stop)

        if self.loop.is_running():
            self.loop.call_soon_threadsafe(cancel_all)
        self._thread.join(_COLLECT_S)

    # --- on the loop ----------------------------------------------------------------------

    async def _group(
        self, sample: Sample, n: int, prefix: str
    ) -> tuple[list[Sampled], list[float]]:
        self._open_pool()
        try:
            async with asyncio.TaskGroup() as sessions:
                tasks = [sessions.create_task(self._session(sample, j, prefix)) for j in range(n)]
        except* HarnessFailed as failures:
            raise HarnessFailed(str(failures.exceptions[0])) from None
        sequences: list[Sampled] = []
        rewards = []
        for task in tasks:
            merged, reward = task.result()
            sequences += merged
            rewards.append(reward)
        return sequences, rewards

    async def _session(self, sample: Sample, j: int, prefix: str) -> tuple[list[Sampled], float]:
        where = f"harness {self.name!r}, session {j}"
        async with self._limit:
            session = f"{prefix}-{j}"
            server: ApiEntry | None = None
            try:
                async with asyncio.timeout(self.timeout_s):
                    server = await self._server()
                    reward = await self._run(sample, server, session)
            except TimeoutError:
                doing = "still running" if server else "found no live generator to call"
                raise HarnessFailed(
                    f"{where}: {doing} after {self.timeout_s:g} s (data.harness_timeout_s)"
                ) from None
            except Exception as error:
                raise HarnessFailed(f"{where}: {type(error).__name__}: {error}") from error
        problem = _not_a_reward(reward)
        if problem is not None:
            raise HarnessFailed(f"{where}: {problem}")
        reward = float(reward)
        assert server is not None  # the harness ran, so it was given one
        sequences = merge_calls(await self._collect(server, session, where), j)
        if not sequences:
            raise HarnessFailed(f"{where}: made no model call, so there is nothing to train")
        return sequences, reward

    def _open_pool(self) -> None:
        """The shared connection pool, made on the loop at the first session."""
        if self._http is None:
            self._http = openai.DefaultAsyncHttpxClient()

    async def _validate(self, samples: list[Sample], prefix: str) -> list[float | str]:
        self._open_pool()
        sessions = (self._validation(s, f"{prefix}-{i}") for i, s in enumerate(samples))
        return list(await asyncio.gather(*sessions))

    async def _validation(self, sample: Sample, session: str) -> float | str:
        async with self._limit:
            try:
                async with asyncio.timeout(self.timeout_s):
                    server = await self._server()
                    client = self._client(server.greedy_url(session), server.key)
                    reward = await self.function(sample, client)
            except TimeoutError:
                return f"still running after {self.timeout_s:g} s (data.harness_timeout_s)"
            except Exception as error:
                return f"{type(error).__name__}: {error}"
        return _not_a_reward(reward) or float(reward)

    def _client(self, base_url: str, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=base_url,
            api_key=key,
            max_retries=0,  # a retried call would be sampled twice, and recorded twice
            timeout=self.timeout_s,
            http_client=self._http,  # shared: never closed with the session's client
        )

    async def _run(self, sample: Sample, server: ApiEntry, session: str) -> Any:
        client = self._client(server.session_url(session), server.key)
        try:
            return await self.function(sample, client)
        except BaseException:
            # What was recorded is not trained: free it on the generator now.
            await asyncio.shield(self._collect_quietly(server, session))
            raise

    async def _server(self) -> ApiEntry:
        """The next live generator in turn, once there is one (within the session's time)."""
        while True:
            live = self.servers()
            if live:
                return live[next(self._turn) % len(live)]
            await asyncio.sleep(_NO_SERVER_POLL_S)

    async def _collect(self, server: ApiEntry, session: str, where: str) -> list[CallRecord]:
        try:
            return await self._fetch_records(server, session)
        except Exception as error:
            raise HarnessFailed(
                f"{where}: its calls' records could not be fetched from {server.worker} "
                f"({server.url}): {type(error).__name__}: {error}"
            ) from None

    async def _collect_quietly(self, server: ApiEntry, session: str) -> None:
        with contextlib.suppress(Exception):  # else the generator drops them in time
            await self._fetch_records(server, session)

    async def _fetch_records(self, server: ApiEntry, session: str) -> list[CallRecord]:
        """The session's records, taken from its generator (which forgets them)."""
        reply = await self._http.get(
            f"{server.url}/sessions/{session}/record",
            headers={"Authorization": f"Bearer {server.key}"},
            timeout=_COLLECT_S,
        )
        reply.raise_for_status()
        return decode_records(reply.content)


def _not_a_reward(value: Any) -> str | None:
    """What is wrong with a harness's return value as a reward, or None."""
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return None
    return f"returned {value!r:.80} ({type(value).__name__}), not a finite number"
