"""Generative judges for the tests: async judge(sample, response, client) -> reward."""

from __future__ import annotations


async def agrees_with_greedy(sample, response: str, client) -> float:
    """Self-consistency: 1.0 if the response's answer is the policy's own greedy answer
    to the same prompt, asked through the generators' API."""
    done = await client.completions.create(model="policy", prompt=sample.prompt, max_tokens=80)
    judged = done.choices[0].text.rpartition(";")[2]
    return 1.0 if response.rpartition(";")[2] == judged else 0.0


def not_async(sample, response: str, client) -> float:
    return 1.0
