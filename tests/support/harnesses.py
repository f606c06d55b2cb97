"""Agent harnesses for the tests: plain async functions run(sample, client) -> reward."""

from __future__ import annotations

import asyncio

from asyncrl.actors.tasks.arithmetic import task


async def ask_once(sample, client) -> float:
    """The arithmetic task through the API: one completion, scored by the task."""
    done = await client.completions.create(model="policy", prompt=sample.prompt, max_tokens=80)
    return task.reward(sample, done.choices[0].text)


async def asks_twice(sample, client) -> float:
    """Two calls, the second extending the first exactly (its token ids, then the question
    again): one sequence a trajectory, the question between the calls untrained."""
    first = await client.completions.create(model="policy", prompt=sample.prompt, max_tokens=40)
    done = first.choices[0]
    again = [*done.prompt_token_ids, *done.token_ids, *done.prompt_token_ids]
    await client.completions.create(model="policy", prompt=again, max_tokens=40)
    return task.reward(sample, done.text)


async def misbehaves(sample, client) -> object:
    """As ask_once, but by the sum of the two last digits: 10 raises, 11 hangs past any
    time limit, 12 returns text."""
    reward = await ask_once(sample, client)
    kind = last_digits_sum(sample.prompt)
    if kind == 10:
        raise ValueError(f"planted failure on {sample.prompt}")
    if kind == 11:
        await asyncio.sleep(3600)
    return "yes" if kind == 12 else reward


async def never_calls(sample, client) -> float:
    return 1.0


def not_async(sample, client) -> float:
    return 1.0


def last_digits_sum(prompt: str) -> int:
    left, right = prompt.rstrip("=").split("+")
    return int(left[-1]) + int(right[-1])
