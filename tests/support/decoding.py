"""Driving a decoder (any engine's) until its responses are in, as the generate role does."""

from __future__ import annotations

import time
from collections.abc import Callable

from asyncrl.actors.policy.decoder import Decoding, Finished

__all__ = ["drain"]


def drain(
    decoder: Decoding,
    count: int,
    *,
    each_step: Callable[[], None] | None = None,
    timeout_s: float = 120,
) -> list[Finished]:
    """Step ``decoder`` until ``count`` responses ended (``each_step`` called after every
    step), failing past ``timeout_s``."""
    results: list[Finished] = []
    deadline = time.monotonic() + timeout_s
    while len(results) < count:
        results += decoder.step()
        if each_step is not None:
            each_step()
        assert time.monotonic() < deadline, f"{len(results)} of {count} responses in {timeout_s} s"
    return results
