"""The demo pipeline: every role's work is a small exact function, so tests check each result.

For the group with key ``q{i:06d}`` (the dataloader's payload ``{"x": i}``)::

    dataloader  feeds new groups                       (into pending)
    generate    {"tokens": arange(1 + i % 7) + i}      pending → generated, behaviour (v, v)
    logp        {"logp": 0.5 * sum(tokens)}            generated → ready (with the two below)
    ref_logp    {"ref": -sum(tokens)}
    reward      {"reward": i % 2}; with algorithm.filter_groups on, the groups with
                ``i % 3 == 0`` are said to carry no signal (``filtered``, never trained)
    train       logp + ref + reward + len(tokens)      ready → trained, one value per group
                in the step's metrics, under "groups" ({key: value})

``v`` is the policy version the generator has loaded: it "loads" each published version
at once. The trainer publishes the step count as a version after every step. The
dataloader resumes by what the scheduler already has, not by a cursor: it offers keys from
``q000000`` on and the scheduler skips the ones it knows.

``ASYNCRL_DEMO_WORK_S`` makes each lease (or feed) take longer, in seconds of sleep, so a
test can kill a worker mid-lease: ``"0.5"`` for every role, or per role, e.g.
``"generate=2,train=0.5"`` (roles not named take no time). A ``work_s`` given to an
actor's constructor wins over the variable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import ClassVar

import msgspec
import numpy as np

from asyncrl.actors.actor import Actor, Outcome, WorkerContext
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p

__all__ = [
    "DEMO_FILTERED",
    "ROLES",
    "WORK_ENV",
    "Dataloader",
    "Generate",
    "Logp",
    "RefLogp",
    "Reward",
    "Train",
    "expected_value",
    "filtered_demo",
    "generate_tokens",
    "logp_of",
    "prompt_key",
    "ref_logp_of",
    "reward_of",
    "train_value",
    "work_time",
]

WORK_ENV = "ASYNCRL_DEMO_WORK_S"

# --- the work, as plain functions ---------------------------------------------------------


def prompt_key(i: int) -> str:
    return f"q{i:06d}"


def generate_tokens(x: int) -> np.ndarray:
    return np.arange(1 + x % 7, dtype=np.int32) + x


def logp_of(tokens: np.ndarray) -> float:
    return float(tokens.sum()) * 0.5


def ref_logp_of(tokens: np.ndarray) -> float:
    return -float(tokens.sum())


DEMO_FILTERED = "demo: i divisible by 3"


def filtered_demo(x: int) -> bool:
    """Whether the demo's reward, filtering, says group ``x`` carries no signal."""
    return x % 3 == 0


def reward_of(x: int) -> float:
    return float(x % 2)


def train_value(data: Mapping[str, p.Payload]) -> float:
    """A trained group's value from what every earlier stage left with it."""
    tokens = data["generate"]["tokens"]
    return data["logp"]["logp"] + data["ref_logp"]["ref"] + data["reward"]["reward"] + len(tokens)


def expected_value(i: int) -> float:
    """What the trainer reports for group ``i``, computed without a pipeline."""
    tokens = generate_tokens(i)
    return logp_of(tokens) + ref_logp_of(tokens) + reward_of(i) + len(tokens)


def work_time(role: str, spec: str) -> float:
    """Seconds of artificial work for ``role`` from a spec like "0.5" or "generate=2,train=1"."""
    spec = spec.strip()
    if not spec:
        return 0.0
    try:
        if "=" not in spec:
            return float(spec)
        pairs = (part.split("=", 1) for part in spec.split(","))
        return {name.strip(): float(value) for name, value in pairs}.get(role, 0.0)
    except ValueError:
        expected = "seconds (0.5) or role=seconds pairs (generate=2,train=1)"
        raise ValueError(f"{WORK_ENV}={spec!r}: expected {expected}") from None


# --- the roles ----------------------------------------------------------------------------


class _DemoActor(Actor):
    def __init__(self, work_s: float | None = None) -> None:
        self.work_s = work_s

    def on_start(self, ctx: WorkerContext) -> None:
        if self.work_s is None:
            self.work_s = work_time(self.role, os.environ.get(WORK_ENV, ""))

    def _pause(self) -> None:
        if self.work_s:
            time.sleep(self.work_s)


class _PerGroup(_DemoActor):
    """A role whose work looks at one group at a time."""

    def process(self, lease: p.Lease) -> Outcome:
        self._pause()
        behaviour = self.behaviour()
        return Outcome(
            tuple(p.Result(item.gid, self.work(item), behaviour) for item in lease.items)
        )

    def work(self, item: p.Item) -> p.Payload:
        raise NotImplementedError

    def behaviour(self) -> tuple[int, int] | None:
        return None


class Dataloader(_DemoActor):
    """Offers ``q{i:06d}`` with ``{"x": i}``; its index is only a hint of where to go on."""

    role: ClassVar[str] = Role.DATALOADER.value
    claim_size: ClassVar[int] = 64

    def __init__(self, work_s: float | None = None, start: int = 0) -> None:
        super().__init__(work_s)
        self.next_index = start

    def feed(self, wanted: int) -> Sequence[p.NewGroup]:
        self._pause()
        first, self.next_index = self.next_index, self.next_index + wanted
        return [p.NewGroup(prompt_key(i), {"x": i}) for i in range(first, first + wanted)]


class Generate(_PerGroup):
    role: ClassVar[str] = Role.GENERATE.value

    def __init__(self, work_s: float | None = None) -> None:
        super().__init__(work_s)
        self.loaded: int | None = None

    def on_version(self, version: int) -> int | None:
        self.loaded = version  # the demo has no weights: loading is instant
        return version

    def work(self, item: p.Item) -> p.Payload:
        return {"tokens": generate_tokens(item.data[Role.DATALOADER]["x"])}

    def behaviour(self) -> tuple[int, int] | None:
        assert self.loaded is not None, "the worker loads a version before it claims"
        return (self.loaded, self.loaded)


class Logp(_PerGroup):
    role: ClassVar[str] = Role.LOGP.value

    def work(self, item: p.Item) -> p.Payload:
        return {"logp": logp_of(item.data[Role.GENERATE]["tokens"])}


class RefLogp(_PerGroup):
    role: ClassVar[str] = Role.REF_LOGP.value

    def work(self, item: p.Item) -> p.Payload:
        return {"ref": ref_logp_of(item.data[Role.GENERATE]["tokens"])}


class Reward(_PerGroup):
    role: ClassVar[str] = Role.REWARD.value
    filtering: bool = False  # algorithm.filter_groups.enabled

    def on_start(self, ctx: WorkerContext) -> None:
        super().on_start(ctx)
        self.filtering = ctx.config.algorithm.filter_groups.enabled

    def process(self, lease: p.Lease) -> Outcome:
        outcome = super().process(lease)
        if not self.filtering:
            return outcome
        xs = {item.gid: item.data[Role.DATALOADER]["x"] for item in lease.items}
        results = tuple(
            msgspec.structs.replace(r, filtered=DEMO_FILTERED) if filtered_demo(xs[r.gid]) else r
            for r in outcome.results
        )
        return Outcome(results)

    def work(self, item: p.Item) -> p.Payload:
        return {"reward": reward_of(item.data[Role.DATALOADER]["x"])}


class Train(_DemoActor):
    """One step per lease: each group's value goes into the step's metrics."""

    role: ClassVar[str] = Role.TRAIN.value
    publishes_versions: ClassVar[bool] = True

    def process(self, lease: p.Lease) -> Outcome:
        self._pause()
        values = {item.key: train_value(item.data) for item in lease.items}
        metrics = {
            "groups": values,
            "batch_groups": len(values),
            "mean_value": sum(values.values()) / len(values),
        }
        results = tuple(p.Result(item.gid, {"value": values[item.key]}) for item in lease.items)
        return Outcome(results, metrics)


ROLES: dict[str, type[Actor]] = {
    cls.role: cls for cls in (Dataloader, Generate, Logp, RefLogp, Reward, Train)
}
