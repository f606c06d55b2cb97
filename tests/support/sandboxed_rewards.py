"""Reward plug-ins for the reward process's tests: each misbehaves in its own way."""

from __future__ import annotations

import os

from asyncrl.actors.tasks import Sample


def exits(sample: Sample, response: str) -> float:
    """Ends its process, as a crash of a native library would, for the response "exit"."""
    if response == "exit":
        os._exit(3)
    return 1.0


def words(sample: Sample, response: str) -> float:
    """Returns text, not a number."""
    return "one"  # type: ignore[return-value]


class Batched:
    """Scores a group in one call, and knows the sample's extras."""

    def __call__(self, sample: Sample, response: str) -> float:
        return self.batch(sample, [response])[0]

    def batch(self, sample: Sample, responses: list[str]) -> list[float]:
        bonus = (sample.extra_info or {}).get("bonus", 0.0)
        return [float(len(response)) + bonus for response in responses]


batched = Batched()
