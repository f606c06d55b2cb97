"""Synthetic roles for the payload benchmark: real bus traffic, no model, payloads of a set size.

``pipeline.actors: tests.bench.payload_actors`` runs them. Every role does next to no
work, so what a group costs is what the runtime spends moving its payloads. The size is
``ASYNCRL_BENCH_PAYLOAD_BYTES`` (bytes per group, a multiple of 16), read when a worker
starts::

    dataloader  {"x": i} for key g{i:07d}
    generate    {"tokens": int32 array of the size}, behaviour (v, v) like the demo's
    logp        {"logp": float32 array of a quarter of the size}
    ref_logp    {"ref": float32 array of a quarter of the size}
    reward      {"reward": float}
    train       reads every stage's payload and reports the bytes it saw

``generate``'s array stands for all a rollout carries (token ids, behaviour log-probs,
versions, masks); a proximal or reference log-prob payload is one float per token, here
taken as a quarter of that. So a group moves 1.5x the size in all, and the trainer's lease
carries every byte of it. Consumers read a few elements spread over each array, so a
payload that arrives lazily is still fetched. The trainer's step metrics carry
``payload_bytes`` (what its lease held), which the benchmark checks against the size.

Only the actor contract and the protocol's payload types are used, so the same module
runs against any version of the runtime that has them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from asyncrl.actors.actor import Actor, Outcome, WorkerContext
from asyncrl.transport import protocol as p

__all__ = ["PAYLOAD_ENV", "ROLES", "group_bytes", "payload_bytes"]

PAYLOAD_ENV = "ASYNCRL_BENCH_PAYLOAD_BYTES"

_SAMPLES = 64  # elements read from each array: enough to touch it end to end


def payload_bytes() -> int:
    """The generate payload's size from the environment (default 64 KiB)."""
    size = int(os.environ.get(PAYLOAD_ENV, str(64 * 1024)))
    if size < 16 or size % 16:
        raise ValueError(f"{PAYLOAD_ENV}={size}: expected a positive multiple of 16 bytes")
    return size


def group_bytes(size: int) -> int:
    """Array bytes that reach the trainer per group: generate's, plus logp's and ref_logp's."""
    return size + 2 * (size // 4)


def _touch(array: np.ndarray) -> float:
    """Read a few elements spread over the whole array."""
    stride = max(1, array.size // _SAMPLES)
    return float(array[::stride].sum())


class _Sized(Actor):
    def on_start(self, ctx: WorkerContext) -> None:
        self.size = payload_bytes()


class _PerGroup(_Sized):
    def process(self, lease: p.Lease) -> Outcome:
        behaviour = self.behaviour()
        return Outcome(
            tuple(p.Result(item.gid, self.work(item), behaviour) for item in lease.items)
        )

    def work(self, item: p.Item) -> p.Payload:
        raise NotImplementedError

    def behaviour(self) -> tuple[int, int] | None:
        return None


class Dataloader(_Sized):
    role: ClassVar[str] = "dataloader"
    claim_size: ClassVar[int] = 64

    def __init__(self) -> None:
        self.next_index = 0

    def feed(self, wanted: int) -> Sequence[p.NewGroup]:
        first, self.next_index = self.next_index, self.next_index + wanted
        return [p.NewGroup(f"g{i:07d}", {"x": i}) for i in range(first, first + wanted)]


class Generate(_PerGroup):
    role: ClassVar[str] = "generate"
    claim_size: ClassVar[int] = 2

    def __init__(self) -> None:
        self.loaded: int | None = None

    def on_version(self, version: int) -> int | None:
        self.loaded = version  # no weights: a version loads at once
        return version

    def work(self, item: p.Item) -> p.Payload:
        x = item.data["dataloader"]["x"]
        return {"tokens": np.full(self.size // 4, x % 50_000, dtype=np.int32)}

    def behaviour(self) -> tuple[int, int] | None:
        assert self.loaded is not None, "the worker loads a version before it claims"
        return (self.loaded, self.loaded)


class _Scorer(_PerGroup):
    """A quarter-size float32 array computed (barely) from the rollout."""

    claim_size: ClassVar[int] = 4
    key: ClassVar[str]

    def work(self, item: p.Item) -> p.Payload:
        seen = _touch(item.data["generate"]["tokens"])
        return {self.key: np.full(self.size // 16, seen, dtype=np.float32)}


class Logp(_Scorer):
    role: ClassVar[str] = "logp"
    key: ClassVar[str] = "logp"


class RefLogp(_Scorer):
    role: ClassVar[str] = "ref_logp"
    key: ClassVar[str] = "ref"


class Reward(_PerGroup):
    role: ClassVar[str] = "reward"

    def work(self, item: p.Item) -> p.Payload:
        return {"reward": float(item.data["dataloader"]["x"] % 2)}


class Train(_Sized):
    """One step per lease; publishes the step as a version, so generation may go on."""

    role: ClassVar[str] = "train"
    publishes_versions: ClassVar[bool] = True

    def process(self, lease: p.Lease) -> Outcome:
        seen = 0
        total = 0.0
        for item in lease.items:
            arrays = _arrays(item.data)
            seen += sum(a.nbytes for a in arrays)
            total += sum(_touch(a) for a in arrays) + item.data["reward"]["reward"]
        results = tuple(p.Result(item.gid, {"value": 0.0}) for item in lease.items)
        metrics = {"batch_groups": len(lease.items), "payload_bytes": seen, "checksum": total}
        return Outcome(results, metrics)


def _arrays(data: Mapping[str, p.Payload]) -> list[np.ndarray]:
    return [data["generate"]["tokens"], data["logp"]["logp"], data["ref_logp"]["ref"]]


ROLES: dict[str, type[Actor]] = {
    cls.role: cls for cls in (Dataloader, Generate, Logp, RefLogp, Reward, Train)
}
