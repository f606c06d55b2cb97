"""What a model call through the generators' OpenAI-compatible API costs, besides decoding.

    python -m tests.bench.api_calls

One process: the embedded model decoding on a thread exactly as a serving generator's
loop does (``Serving.advance``), its API on uvicorn, and the official openai client
calling it. Printed: one one-token call at a time (plain HTTP with urllib, the sync
client, the async client), then many sessions at once, each with the decode steps the
calls took and the time those steps took, so what is not decoding shows.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.request

import openai

from asyncrl.actors.serving.directory import ApiEntry
from tests.support.served_api import ServedApi, served_api

PROMPT = "4589+123="


class StepClock:
    """The decode loop's step (``Serving.advance``), counting the steps that had work and
    their time."""

    def __init__(self) -> None:
        self.steps, self.step_s = 0, 0.0

    def __call__(self, served: ServedApi) -> None:
        started = time.perf_counter()
        busy = served.decoder.busy or served.serving.busy
        served.serving.advance(served.decoder)
        if busy:
            self.steps += 1
            self.step_s += time.perf_counter() - started


def one_at_a_time(entry: ApiEntry, calls: int = 20) -> None:
    body = json.dumps({"model": "policy", "prompt": PROMPT, "max_tokens": 1}).encode()
    headers = {"Authorization": f"Bearer {entry.key}", "Content-Type": "application/json"}
    started = time.perf_counter()
    for _ in range(calls):
        url = entry.session_url("urllib") + "/completions"
        with urllib.request.urlopen(urllib.request.Request(url, body, headers)) as reply:
            reply.read()
    print(f"urllib, one call at a time: {(time.perf_counter() - started) / calls * 1e3:.1f} ms")
    client = openai.OpenAI(base_url=entry.session_url("sync"), api_key=entry.key, max_retries=0)
    started = time.perf_counter()
    for _ in range(calls):
        client.completions.create(model="policy", prompt=PROMPT, max_tokens=1)
    print(
        f"openai client, one call at a time: {(time.perf_counter() - started) / calls * 1e3:.1f} ms"
    )


async def sessions(entry: ApiEntry, count: int, calls: int, max_tokens: int) -> float:
    pool = openai.DefaultAsyncHttpxClient()  # shared, as the harness role shares it

    async def session(i: int) -> None:
        client = openai.AsyncOpenAI(
            base_url=entry.session_url(f"s{i}"), api_key=entry.key, max_retries=0,
            http_client=pool,
        )  # fmt: skip
        for _ in range(calls):
            await client.completions.create(model="policy", prompt=PROMPT, max_tokens=max_tokens)

    started = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(count)))
    await pool.aclose()
    return time.perf_counter() - started


def main() -> None:
    config = {
        "run": {"dir": tempfile.mkdtemp()},
        "data": {"harness": "tests.support.harnesses:ask_once"},
        "model": {"max_new_tokens": 80, "max_prompt_tokens": 512},
    }
    clock = StepClock()
    with served_api(config, slots=64, step=clock) as served:
        one_at_a_time(served.entry)
        for count, calls, max_tokens in ((1, 50, 1), (32, 4, 1), (32, 2, 80)):
            clock.steps, clock.step_s = 0, 0.0
            took = asyncio.run(sessions(served.entry, count, calls, max_tokens))
            print(
                f"{count} sessions x {calls} calls of up to {max_tokens} tokens: {took:.2f} s "
                f"({took / (count * calls) * 1e3:.1f} ms a call); {clock.steps} decode steps "
                f"took {clock.step_s:.2f} s of it"
            )


if __name__ == "__main__":
    main()
