"""A generative judge as the reward (``data.reward: judge:package.module:attr``).

The judge is a plain async function ``judge(sample, response, client) -> float`` written
against the official ``openai`` client, like a harness; the client is bound to a greedy
session on one of the run's live generators (:mod:`.directory`): the policy being
trained, served by the generate role beside its leases, decodes the judge's calls
greedily and records nothing of them. The reward role scores a group's responses at
once, concurrently, under ``data.reward_timeout_s`` for the whole group (through
:class:`~asyncrl.actors.tasks.RewardFunction`, whose ``batch`` path this is).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from pathlib import Path
from typing import Any

import openai

from ..tasks import Sample
from ..tasks.rewards import load_judge
from .directory import ApiDirectory

__all__ = ["JudgeReward"]

_NO_SERVER_POLL_S = 0.05


class JudgeReward:
    """``batch(sample, responses)``: every response judged at once by the policy itself."""

    def __init__(self, choice: str, api_servers: Path, timeout_s: float) -> None:
        self.function = load_judge(choice)
        self.directory = ApiDirectory(api_servers)
        self.timeout_s = timeout_s or None
        self._turn = itertools.count()

    def __call__(self, sample: Sample, response: str) -> float:
        return self.batch(sample, [response])[0]

    def batch(self, sample: Sample, responses: list[str]) -> list[Any]:
        # A loop per group: the reward role is synchronous, and a group's judgements
        # are what is worth running concurrently.
        return asyncio.run(self._judge_all(sample, responses))

    async def _judge_all(self, sample: Sample, responses: list[str]) -> list[Any]:
        # Bounded here too: a call past the reward's time limit is left running on a
        # thread, and must not wait for a generator forever.
        async with asyncio.timeout(self.timeout_s), openai.DefaultAsyncHttpxClient() as http:
            calls = (self._judge(sample, r, http, i) for i, r in enumerate(responses))
            return list(await asyncio.gather(*calls))

    async def _judge(self, sample: Sample, response: str, http: Any, i: int) -> Any:
        while not (live := self.directory.live()):
            await asyncio.sleep(_NO_SERVER_POLL_S)  # a generator not up yet, or restarting
        server = live[next(self._turn) % len(live)]
        client = openai.AsyncOpenAI(
            base_url=server.greedy_url(f"judge-{secrets.token_hex(6)}-{i}"),
            api_key=server.key,
            max_retries=0,
            timeout=self.timeout_s,
            http_client=http,
        )
        return await self.function(sample, response, client)
