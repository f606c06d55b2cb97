"""What each RL role leaves with a group, declared once: the payloads on the bus.

A group's data is a dict from role to that role's payload (MessagePack maps whose arrays
travel as raw frames). Each class here is one role's payload: ``to_payload`` builds it,
``of`` reads it back from a leased item, checking what it reads.

Responses of a group are stored padded to the longest one, ``[n, longest]``, with
``lengths`` saying how many tokens of each row are real.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asyncrl.runtime.core.pipeline import Role
from asyncrl.transport import protocol as p

__all__ = ["LogprobsOut", "PayloadError", "PromptIn", "RewardsOut", "RolloutsOut"]


class PayloadError(ValueError):
    """A group's data lacks what a role needs (a bug upstream, or a foreign producer)."""


def _field(item: p.Item, role: Role, key: str) -> object:
    try:
        return item.data[role.value][key]
    except (KeyError, TypeError):
        raise PayloadError(f"group {item.key!r} has no {role.value}.{key}") from None


def _array(item: p.Item, role: Role, key: str, dtype: str, dims: int) -> np.ndarray:
    value = _field(item, role, key)
    if not isinstance(value, np.ndarray) or value.dtype != dtype or value.ndim != dims:
        raise PayloadError(f"group {item.key!r}: {role.value}.{key} is not a {dims}-d {dtype}")
    return value


@dataclass(frozen=True)
class PromptIn:
    """The dataloader's: which sample of the task this group is."""

    index: int
    prompt: str
    answer: str

    def to_payload(self) -> p.Payload:
        return {"index": self.index, "prompt": self.prompt, "answer": self.answer}

    @classmethod
    def of(cls, item: p.Item) -> PromptIn:
        return cls(
            index=int(_field(item, Role.DATALOADER, "index")),
            prompt=str(_field(item, Role.DATALOADER, "prompt")),
            answer=str(_field(item, Role.DATALOADER, "answer")),
        )


@dataclass(frozen=True)
class RolloutsOut:
    """The generator's: n responses, each token with its log-prob and policy version."""

    prompt_ids: np.ndarray  # int32 [prompt tokens]
    response_ids: np.ndarray  # int32 [n, longest]
    lengths: np.ndarray  # int32 [n]
    logprobs: np.ndarray  # float32 [n, longest] behaviour log-probs
    versions: np.ndarray  # int32 [n, longest] the policy version behind each token
    truncated: np.ndarray  # uint8 [n] 1 where the length limit, not end-of-sequence, ended it

    def to_payload(self) -> p.Payload:
        return {
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "lengths": self.lengths,
            "logprobs": self.logprobs,
            "versions": self.versions,
            "truncated": self.truncated,
        }

    @classmethod
    def of(cls, item: p.Item) -> RolloutsOut:
        g = Role.GENERATE
        return cls(
            prompt_ids=_array(item, g, "prompt_ids", "int32", 1),
            response_ids=_array(item, g, "response_ids", "int32", 2),
            lengths=_array(item, g, "lengths", "int32", 1),
            logprobs=_array(item, g, "logprobs", "float32", 2),
            versions=_array(item, g, "versions", "int32", 2),
            truncated=_array(item, g, "truncated", "uint8", 1),
        )

    @classmethod
    def stack(cls, prompt: list[int], rows: list[tuple[list[int], list[float], list[int], bool]]):
        """From per-response (tokens, logprobs, versions, truncated), padded to the longest."""
        longest = max(len(tokens) for tokens, *_ in rows)
        shape = (len(rows), longest)
        ids, logprobs = np.zeros(shape, np.int32), np.zeros(shape, np.float32)
        versions = np.zeros(shape, np.int32)
        for row, (tokens, lps, vers, _) in enumerate(rows):
            ids[row, : len(tokens)] = tokens
            logprobs[row, : len(tokens)] = lps
            versions[row, : len(tokens)] = vers
        return cls(
            prompt_ids=np.asarray(prompt, np.int32),
            response_ids=ids,
            lengths=np.array([len(tokens) for tokens, *_ in rows], np.int32),
            logprobs=logprobs,
            versions=versions,
            truncated=np.array([t for *_, t in rows], np.uint8),
        )

    def responses(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.response_ids, self.lengths, strict=True)]

    def behaviour(self) -> tuple[int, int]:
        """The oldest and newest policy version among the group's tokens."""
        mask = np.arange(self.versions.shape[1])[None] < self.lengths[:, None]
        used = self.versions[mask]
        return int(used.min()), int(used.max())


@dataclass(frozen=True)
class LogprobsOut:
    """logp's (under a policy ``version``) or ref_logp's (``version`` None): [n, longest]."""

    logprobs: np.ndarray
    version: int | None

    def to_payload(self) -> p.Payload:
        return {"logprobs": self.logprobs, "version": self.version}

    @classmethod
    def of(cls, item: p.Item, role: Role) -> LogprobsOut:
        version = _field(item, role, "version")
        return cls(_array(item, role, "logprobs", "float32", 2), version)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RewardsOut:
    """reward's: one number per response."""

    rewards: np.ndarray  # float32 [n]

    def to_payload(self) -> p.Payload:
        return {"rewards": self.rewards}

    @classmethod
    def of(cls, item: p.Item) -> RewardsOut:
        return cls(_array(item, Role.REWARD, "rewards", "float32", 1))
