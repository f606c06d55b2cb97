"""A session's calls → the token sequences to train, each token as it was sampled.

A call whose prompt starts with everything the session's current sequence holds (the
previous call's prompt and completion) extends that sequence: the new prompt tokens in
between (a tool's output, the next user turn) join it untrained, then the completion's
tokens, trained. A call that does not extend it (the harness rewrote the history, or
templated the assistant's turn differently from what was sampled) starts a new sequence
of the same trajectory. Nothing is tokenised again: every id is one the server saw.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..payloads import Sampled
from .call_records import CallRecord

__all__ = ["merge_calls"]


def merge_calls(calls: Sequence[CallRecord], owner: int) -> list[Sampled]:
    """``calls`` of one session, in the order made, as sequences of trajectory ``owner``."""
    merged: list[Sampled] = []
    tokens: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    trained: list[bool] = []
    truncated = False
    for call in calls:
        prompt = call.prompt_ids
        if not (tokens and len(prompt) >= len(tokens) and prompt[: len(tokens)] == tokens):
            if tokens:
                merged.append(Sampled(tokens, logprobs, versions, trained, truncated, owner))
            tokens, logprobs, versions, trained = [], [], [], []
        new = prompt[len(tokens) :]
        tokens += [*new, *call.completion_ids]
        logprobs += [0.0] * len(new) + list(call.logprobs)
        versions += [0] * len(new) + list(call.versions)
        trained += [False] * len(new) + [True] * len(call.completion_ids)
        truncated = call.truncated
    if tokens:
        merged.append(Sampled(tokens, logprobs, versions, trained, truncated, owner))
    return merged
