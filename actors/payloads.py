"""What each RL role leaves with a group, declared once: the payloads on the bus.

A group's data is a dict from role to that role's payload (MessagePack maps whose arrays
travel as raw frames). Each class here is one role's payload: ``to_payload`` builds it,
``of`` reads it back from a leased item, checking what it reads.

A group's sequences are stored padded to the longest one, ``[rows, longest]``, with
``lengths`` saying how many tokens of each row are real.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p

from .tasks.base import Sample

__all__ = [
    "LogprobsOut",
    "PayloadError",
    "PromptIn",
    "RewardsOut",
    "RolloutsOut",
    "Sampled",
    "ValuesOut",
]


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
    """The dataloader's: which sample of the task this group is, and what a reward
    function or an environment reads of it."""

    index: int
    prompt: str
    answer: str
    data_source: str = ""
    extra_info: Mapping[str, Any] | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None

    def to_payload(self) -> p.Payload:
        payload = {"index": self.index, "prompt": self.prompt, "answer": self.answer}
        if self.data_source:
            payload["data_source"] = self.data_source
        if self.extra_info is not None:
            payload["extra_info"] = dict(self.extra_info)
        if self.messages is not None:
            payload["messages"] = [dict(m) for m in self.messages]
        return payload

    @classmethod
    def of(cls, item: p.Item) -> PromptIn:
        data = item.data.get(Role.DATALOADER.value)
        extra = data.get("extra_info") if isinstance(data, dict) else None
        if extra is not None and not isinstance(extra, dict):
            raise PayloadError(f"group {item.key!r}: dataloader.extra_info is not a mapping")
        messages = data.get("messages") if isinstance(data, dict) else None
        if messages is not None and not (
            isinstance(messages, list) and all(isinstance(m, dict) for m in messages)
        ):
            raise PayloadError(f"group {item.key!r}: dataloader.messages is not a list of maps")
        return cls(
            index=int(_field(item, Role.DATALOADER, "index")),
            prompt=str(_field(item, Role.DATALOADER, "prompt")),
            answer=str(_field(item, Role.DATALOADER, "answer")),
            data_source=str(data.get("data_source", "")) if isinstance(data, dict) else "",
            extra_info=extra,
            messages=None if messages is None else tuple(messages),
        )

    @classmethod
    def from_sample(cls, index: int, sample: Sample) -> PromptIn:
        return cls(
            index,
            sample.prompt,
            sample.answer,
            sample.data_source,
            sample.extra_info,
            sample.messages,
        )

    def sample(self) -> Sample:
        """The task's sample, as reward functions and environments are given it."""
        return Sample(self.prompt, self.answer, self.data_source, self.extra_info, self.messages)


@dataclass(frozen=True)
class Sampled:
    """One token sequence of a trajectory, whole: prompt, the model's tokens and any
    observation or tool tokens between its turns, each token with what training needs."""

    tokens: Sequence[int]
    logprobs: Sequence[float]  # the behaviour log-prob of each token (0 where not sampled)
    versions: Sequence[int]  # the policy version behind each token (0 where not sampled)
    trained: Sequence[bool]  # the loss mask: True on the model's own sampled tokens
    truncated: bool = False  # a length or turn limit, not the model, ended it
    owner: int = 0  # which of the group's trajectories it belongs to
    # Router replay's record: the experts of the sequence's first tokens, [tokens, layers,
    # per_token] (every token the model read; see Finished.routes); None: not recorded.
    routes: np.ndarray | None = None


@dataclass(frozen=True)
class RolloutsOut:
    """The generator's: a group's sequences, each token with its log-prob and policy version.

    A group has ``data.group_size`` trajectories (one per sampled answer). A single-turn
    trajectory is one sequence: the shared prompt, then the response. A multi-turn one
    (an environment's, a harness's) interleaves the model's tokens with observation and
    tool tokens, which ``loss_mask`` leaves out of every log-prob, loss and gradient; a
    harness session whose calls do not extend each other is several sequences of one
    trajectory (``owners``). ``prompt_ids`` is the prefix every sequence shares.

    Router replay (a generator that records): ``routes`` holds the experts each
    mixture-of-experts layer chose for every response token the model read, and
    ``prompt_routes`` those of the prompt's tokens: once, ``[prompt, layers, per_token]``,
    when every sequence's prompt went the same way, else ``[rows, prompt, layers,
    per_token]``. uint8 up to 256 experts, int16 beyond: layers x per_token bytes (or
    twice that) a token. A response's last token was never read; its route is 0.
    """

    prompt_ids: np.ndarray  # int32 [prompt tokens]
    response_ids: np.ndarray  # int32 [rows, longest] each sequence after the shared prompt
    lengths: np.ndarray  # int32 [rows]
    logprobs: np.ndarray  # float32 [rows, longest] behaviour log-probs
    versions: np.ndarray  # int32 [rows, longest] the policy version behind each token
    truncated: np.ndarray  # uint8 [rows] 1 where a limit, not end-of-sequence, ended it
    loss_mask: np.ndarray  # uint8 [rows, longest] 1 on tokens the model sampled
    owners: np.ndarray  # int32 [rows] the trajectory (0..n-1) each sequence belongs to
    rewards: np.ndarray | None = None  # float32 [n]: what an environment or harness paid
    routes: np.ndarray | None = None  # uint8|int16 [rows, longest, layers, per_token]
    prompt_routes: np.ndarray | None = None  # [prompt, layers, per_token] or per row

    def to_payload(self) -> p.Payload:
        payload = {
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "lengths": self.lengths,
            "logprobs": self.logprobs,
            "versions": self.versions,
            "truncated": self.truncated,
            "loss_mask": self.loss_mask,
            "owners": self.owners,
        }
        if self.rewards is not None:
            payload["rewards"] = self.rewards
        if self.routes is not None:
            payload["routes"] = self.routes
            payload["prompt_routes"] = self.prompt_routes
        return payload

    @classmethod
    def of(cls, item: p.Item, *, routes: bool = False) -> RolloutsOut:
        """``routes``: the group must carry the generator's routes (router replay is on);
        PayloadError naming it if it does not."""
        # Filed under the role that made it: the generators', or the agent harnesses' when
        # they hold the admit stage (data.harness).
        g = Role.HARNESS if Role.HARNESS.value in item.data else Role.GENERATE
        prompt_ids = _array(item, g, "prompt_ids", "int32", 1)
        response_ids = _array(item, g, "response_ids", "int32", 2)
        lengths = _array(item, g, "lengths", "int32", 1)
        rows, width = response_ids.shape
        if len(lengths) != rows:
            raise PayloadError(f"group {item.key!r}: {len(lengths)} lengths for {rows} rows")
        data = item.data[g.value]
        out = cls(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            lengths=lengths,
            logprobs=_array(item, g, "logprobs", "float32", 2),
            versions=_array(item, g, "versions", "int32", 2),
            truncated=_array(item, g, "truncated", "uint8", 1),
            # A producer of single-turn groups may leave these out: every token trained,
            # one sequence per trajectory.
            loss_mask=(
                _array(item, g, "loss_mask", "uint8", 2)
                if "loss_mask" in data
                else _within(lengths, width).astype(np.uint8)
            ),
            owners=(
                _array(item, g, "owners", "int32", 1)
                if "owners" in data
                else np.arange(rows, dtype=np.int32)
            ),
            rewards=_array(item, g, "rewards", "float32", 1) if "rewards" in data else None,
        )
        for name in ("logprobs", "versions", "loss_mask"):
            if getattr(out, name).shape != response_ids.shape:
                shape = "[rows, longest]"
                raise PayloadError(f"group {item.key!r}: {g.value}.{name} is not {shape}")
        if out.owners.shape != lengths.shape or out.truncated.shape != lengths.shape:
            raise PayloadError(f"group {item.key!r}: {g.value}.owners/truncated: one per row")
        if "routes" in data:
            return replace(out, **_routes_of(item, g, out))
        if routes:
            raise PayloadError(
                f"group {item.key!r} has no {g.value}.routes: router replay "
                "(algorithm.router_replay.enabled) needs a generator that records each "
                "token's experts (backends.generate=torch)"
            )
        return out

    @classmethod
    def stack(cls, prompt: list[int], rows: list[tuple[list[int], list[float], list[int], bool]]):
        """Single-turn: per response (tokens, logprobs, versions, truncated), every token
        trained, one response per trajectory."""
        return cls.from_sequences(
            [
                Sampled(
                    [*prompt, *tokens],
                    [0.0] * len(prompt) + list(lps),
                    [0] * len(prompt) + list(vers),
                    [False] * len(prompt) + [True] * len(tokens),
                    truncated,
                    owner,
                )
                for owner, (tokens, lps, vers, truncated) in enumerate(rows)
            ]
        )

    @classmethod
    def from_sequences(
        cls, sequences: Sequence[Sampled], rewards: Sequence[float] | None = None
    ) -> RolloutsOut:
        """Whole sequences into the padded layout, the prefix they all share (up to the
        first trained token) as the prompt. ValueError if they share no first token or
        a sequence trains none of its tokens (nothing to score it by)."""
        if not sequences:
            raise ValueError("a group needs at least one sequence")
        for i, s in enumerate(sequences):
            if not len(s.tokens) == len(s.logprobs) == len(s.versions) == len(s.trained):
                raise ValueError(f"sequence {i}: tokens, logprobs, versions, mask: unequal lengths")
            if not any(s.trained):
                raise ValueError(f"sequence {i} has no token the model sampled")
        shared = min(list(s.trained).index(True) for s in sequences)
        first = sequences[0].tokens
        for s in sequences[1:]:
            shared = next((k for k in range(shared) if s.tokens[k] != first[k]), shared)
        if shared == 0:
            raise ValueError("the group's sequences share no first token (a prompt to score from)")
        longest = max(len(s.tokens) for s in sequences) - shared
        shape = (len(sequences), longest)
        ids, logprobs = np.zeros(shape, np.int32), np.zeros(shape, np.float32)
        versions, mask = np.zeros(shape, np.int32), np.zeros(shape, np.uint8)
        for row, s in enumerate(sequences):
            n = len(s.tokens) - shared
            ids[row, :n] = s.tokens[shared:]
            logprobs[row, :n] = s.logprobs[shared:]
            versions[row, :n] = s.versions[shared:]
            mask[row, :n] = s.trained[shared:]
        prompt_routes, routes = _stacked_routes(sequences, shared, longest)
        return cls(
            prompt_ids=np.asarray(first[:shared], np.int32),
            response_ids=ids,
            lengths=np.array([len(s.tokens) - shared for s in sequences], np.int32),
            logprobs=logprobs,
            versions=versions,
            truncated=np.array([s.truncated for s in sequences], np.uint8),
            loss_mask=mask,
            owners=np.array([s.owner for s in sequences], np.int32),
            rewards=None if rewards is None else np.asarray(rewards, np.float32),
            routes=routes,
            prompt_routes=prompt_routes,
        )

    def responses(self) -> list[list[int]]:
        return [row[:n].tolist() for row, n in zip(self.response_ids, self.lengths, strict=True)]

    def trained_mask(self) -> np.ndarray:
        """bool [rows, longest]: the tokens the model sampled (trained, counted, scored)."""
        return _within(self.lengths, self.response_ids.shape[1]) & (self.loss_mask != 0)

    def trained_tokens(self) -> int:
        return int(self.trained_mask().sum())

    def behaviour(self) -> tuple[int, int]:
        """The oldest and newest policy version among the tokens the model sampled."""
        used = self.versions[self.trained_mask()]
        return int(used.min()), int(used.max())

    def row_routes(self) -> list[np.ndarray]:
        """Per row, the routes of its prompt and response, [prompt + length, layers,
        per_token] (router replay; the group must carry them)."""
        if self.routes is None or self.prompt_routes is None:
            raise ValueError("the group carries no routes")
        out = []
        for row, n in enumerate(self.lengths):
            prompt = self.prompt_routes if self.prompt_routes.ndim == 3 else self.prompt_routes[row]
            out.append(np.concatenate([prompt, self.routes[row, :n]]))
        return out

    def route_bytes(self) -> int:
        """The routes' size in the payload (0 without them)."""
        if self.routes is None or self.prompt_routes is None:
            return 0
        return self.routes.nbytes + self.prompt_routes.nbytes


_ROUTE_DTYPES = ("uint8", "int16")


def _stacked_routes(
    sequences: Sequence[Sampled], shared: int, longest: int
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(prompt_routes, routes) of sequences that all carry routes; (None, None) if any
    does not. The shared prompt's are kept once if every sequence's are equal."""
    records = [s.routes for s in sequences]
    if any(r is None for r in records):
        return None, None
    first = records[0]
    assert first is not None
    for i, (s, r) in enumerate(zip(sequences, records, strict=True)):
        assert r is not None
        if r.ndim != 3 or r.shape[1:] != first.shape[1:] or r.dtype != first.dtype:
            raise ValueError(f"sequence {i}: routes {r.dtype} {r.shape}, unlike sequence 0's")
        if not shared <= len(r) <= len(s.tokens):
            raise ValueError(
                f"sequence {i}: routes for {len(r)} tokens; expected {shared}.."
                f"{len(s.tokens)} (its prompt up to all its tokens)"
            )
    prompts = np.stack([r[:shared] for r in records])  # type: ignore[index]
    same = all(np.array_equal(prompts[0], one) for one in prompts[1:])
    routes = np.zeros((len(sequences), longest, *first.shape[1:]), first.dtype)
    for row, r in enumerate(records):
        tail = r[shared:]  # type: ignore[index]
        routes[row, : len(tail)] = tail
    return (prompts[0] if same else prompts), routes


def _routes_of(item: p.Item, g: Role, out: RolloutsOut) -> dict[str, np.ndarray]:
    """The routes of a group that carries them, their shapes checked against ``out``'s."""
    data = item.data[g.value]
    routes, prompt = data.get("routes"), data.get("prompt_routes")
    for name, value in (("routes", routes), ("prompt_routes", prompt)):
        if not isinstance(value, np.ndarray) or value.dtype.name not in _ROUTE_DTYPES:
            raise PayloadError(f"group {item.key!r}: {g.value}.{name} is not a uint8/int16 array")
    assert isinstance(routes, np.ndarray) and isinstance(prompt, np.ndarray)
    rows, width = out.response_ids.shape
    if routes.ndim != 4 or routes.shape[:2] != (rows, width):
        raise PayloadError(
            f"group {item.key!r}: {g.value}.routes is {list(routes.shape)}; expected "
            f"[{rows}, {width}, layers, per_token]"
        )
    each = routes.shape[2:]
    tokens = len(out.prompt_ids)
    if prompt.dtype != routes.dtype or prompt.shape not in (
        (tokens, *each),
        (rows, tokens, *each),
    ):
        raise PayloadError(
            f"group {item.key!r}: {g.value}.prompt_routes is {prompt.dtype} "
            f"{list(prompt.shape)}; expected {routes.dtype} [{tokens}, {each[0]}, {each[1]}] "
            f"or [{rows}, {tokens}, {each[0]}, {each[1]}]"
        )
    return {"routes": routes, "prompt_routes": prompt}


def _within(lengths: np.ndarray, width: int) -> np.ndarray:
    return np.arange(width)[None] < lengths[:, None]


@dataclass(frozen=True)
class LogprobsOut:
    """logp's (under a policy ``version``) or ref_logp's (``version`` None): [n, longest].

    ``reused``: logp took the generator's log-probs as its own instead of scoring (see
    :func:`..roles.logp.reuses_generator_logprobs`); they then say nothing of how far
    generator and trainer are apart.
    """

    logprobs: np.ndarray
    version: int | None
    reused: bool = False

    def to_payload(self) -> p.Payload:
        return {"logprobs": self.logprobs, "version": self.version, "reused": self.reused}

    @classmethod
    def of(cls, item: p.Item, role: Role) -> LogprobsOut:
        version = _field(item, role, "version")
        reused = item.data[role.value].get("reused", False)  # absent: a payload of before
        if type(reused) is not bool:
            raise PayloadError(f"group {item.key!r}: {role.value}.reused is not a bool")
        logprobs = _array(item, role, "logprobs", "float32", 2)
        return cls(logprobs, version, reused)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RewardsOut:
    """reward's: one number per trajectory, and the parts it is the sum of.

    ``parts`` names each part (float32 ``[n]``): ``"task"``, the task's, environment's or
    harness's own reward, and ``"overlong"``, the soft overlong punishment (<= 0; present
    when ``algorithm.overlong_buffer`` is on). Built without parts, or read from a payload
    that has none (one of before parts were kept), ``parts`` is ``{"task": rewards}``.
    """

    rewards: np.ndarray  # float32 [n]
    parts: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.parts:
            object.__setattr__(self, "parts", {"task": self.rewards})

    @classmethod
    def summed(cls, parts: Mapping[str, np.ndarray]) -> RewardsOut:
        """The rewards that are the sum of ``parts`` (at least one)."""
        arrays = {name: np.asarray(part, np.float32) for name, part in parts.items()}
        total = np.sum(np.stack(list(arrays.values())), axis=0, dtype=np.float32)
        return cls(total, arrays)

    def to_payload(self) -> p.Payload:
        return {"rewards": self.rewards, "parts": dict(self.parts)}

    @classmethod
    def of(cls, item: p.Item) -> RewardsOut:
        rewards = _array(item, Role.REWARD, "rewards", "float32", 1)
        parts = item.data[Role.REWARD.value].get("parts")
        if parts is None:
            return cls(rewards)
        if not isinstance(parts, dict) or not parts:
            raise PayloadError(f"group {item.key!r}: reward.parts is not a map of arrays")
        for name, part in parts.items():
            if not (
                isinstance(part, np.ndarray)
                and part.dtype == "float32"
                and part.shape == rewards.shape
            ):
                raise PayloadError(
                    f"group {item.key!r}: reward.parts[{name!r}] is not a float32 array "
                    f"shaped like the rewards {rewards.shape}"
                )
        return cls(rewards, parts)


@dataclass(frozen=True)
class ValuesOut:
    """values': the critic's value of the state before each response token, [n, longest],
    under critic ``version``. Made by the values stage, or by the critic's step (in its
    result, beside ``critic_trained_at``) when no values stage runs."""

    values: np.ndarray  # float32
    version: int

    def to_payload(self) -> p.Payload:
        return {"values": self.values, "version": self.version}

    @classmethod
    def of(cls, item: p.Item, role: Role = Role.VALUES) -> ValuesOut:
        version = int(_field(item, role, "version"))  # type: ignore[call-overload]
        return cls(_array(item, role, "values", "float32", 2), version)

    @classmethod
    def made_for(cls, item: p.Item) -> ValuesOut | None:
        """The values ``item`` carries, from whichever stage made them; None: none."""
        if Role.VALUES in item.data:
            return cls.of(item)
        critic = item.data.get(Role.CRITIC)
        if isinstance(critic, dict) and "values" in critic:
            return cls.of(item, Role.CRITIC)
        return None
