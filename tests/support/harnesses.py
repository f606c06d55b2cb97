"""Agent harnesses for the tests: plain async functions run(sample, client) -> reward."""

from __future__ import annotations

import asyncio

from asyncrl.actors.tasks.arithmetic import task


async def ask_once(sample, client) -> float:
    """The arithmetic task through the API: one completion, scored by the task."""
    done = await client.completions.create(model="policy", prompt=sample.prompt, max_tokens=80)
    return task.reward(sample, done.choices[0].text)


async def fails_on_carries(sample, client) -> float:
    """Raises on prompts whose first digits sum past 9; else as ask_once."""
    reward = await ask_once(sample, client)
    if _carries(sample.prompt):
        raise ValueError(f"planted failure on {sample.prompt}")
    return reward


async def hangs_on_carries(sample, client) -> float:
    reward = await ask_once(sample, client)
    if _carries(sample.prompt):
        await asyncio.sleep(3600)
    return reward


async def says_yes_on_carries(sample, client) -> object:
    reward = await ask_once(sample, client)
    return "yes" if _carries(sample.prompt) else reward


def _carries(prompt: str) -> bool:
    left, right = prompt.rstrip("=").split("+")
    return int(left[-1]) + int(right[-1]) > 9
