"""One rank of the trainer: its learner, its staged state, its step count, and the orders
it carries out (alone, or as the leader's or a follower's part of a group's order).

A step is staged before the rank meets the others in the step's gather of the new
weights, so when the leader has the new version every rank's state for it is staged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import structlog
import torch

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport.weights import Announcement, WeightPublisher
from asyncrl.transport.weights.parts import compose, whole_shapes

from ..policy.collectives import all_gather_data
from .gang import Order
from .learner import Group, Learner
from .learner_state import LearnerState, OwnPart
from .resume import Choice, reserve, restore, stage
from .staged_state import StagedState

__all__ = ["TrainRank", "critic_ranks", "publish_parts", "restore_body", "staged_identity"]

log = structlog.get_logger("asyncrl.train")


def staged_identity(cfg: RunConfig, ranks: int) -> dict[str, object]:
    """What a rank's staged tensors depend on: a state staged under another split of the
    model (rank count, engine, megatron's parallel sizes, the optimizer's split) is
    ignored on resume, which then starts from a checkpoint."""
    identity: dict[str, object] = {"ranks": ranks, "engine": cfg.backends.train}
    if cfg.model.lora.enabled:  # the adapters' shapes and what they adapt
        lora = cfg.model.lora
        identity["lora"] = [lora.rank, sorted(lora.target_modules)]
    if cfg.backends.train == "megatron":
        m = cfg.backends.megatron
        split = [m.tensor_parallel, m.pipeline_parallel, m.expert_parallel]
        identity |= {"megatron": split, "distributed_optimizer": m.distributed_optimizer}
    return identity


def critic_ranks(cfg: RunConfig) -> int:
    """The ranks of the critic's group (``pipeline.workers.critic``; 1: one process)."""
    return cfg.pipeline.workers.get("critic", 1)


class TrainRank:
    """This process's share of the trainer (or of the critic: ``learner`` says which).
    Starts from the base model; :meth:`restore` takes up the state to resume from.

    The critic (``critic``) stages in its own directory and keeps its own checkpoints
    (``RunDir.critic_checkpoints``); its weights are published as the trainer's are, to
    its values workers."""

    def __init__(self, cfg: RunConfig, learner: LearnerState, rank: int, ranks: int):
        self.cfg = cfg
        self.run = RunDir.of(cfg)
        self.ranks = ranks
        self.learner = learner
        self.critic = not isinstance(learner, Learner)
        directory = self.run.critic_staged_state if self.critic else self.run.staged_state
        self.store = StagedState(directory, rank, staged_identity(cfg, ranks))
        self.step = 0
        # Where the last step's seconds went, by phase: the update (forward, backward and
        # the optimizer), staging its state, gathering its weights whole for publishing
        # (or, publishing from every rank, staging its part and gathering the parts').
        self.phases: dict[str, float] = {}
        # weights.from_every_rank in a group: this rank's own publisher of its parts, made
        # at the first restore (which says whether the run is on one host)
        self.part_publisher: WeightPublisher | None = None
        # (local, its part's index) -> the publisher, in the part's weight directories
        self.make_part_publisher: Callable[[bool, int], WeightPublisher] | None = None

    def carry_out(self, order: Order, groups: list[Group] | None = None, body: bytes = b"") -> Any:
        """An order's work, the same sequence of collectives on every rank."""
        if order is Order.STEP:
            assert groups is not None
            return self.train(groups)
        if order is Order.RESTORE:
            return self.restore(*msgpack.unpackb(body))
        if order is Order.GATHER:
            return self.learner.full_weights(), self.learner.full_optimizer_state()
        raise ValueError(f"no work for order {order}")

    def restore(
        self, target: int, local: bool = True
    ) -> tuple[Choice, dict[str, torch.Tensor] | Announcement]:
        """Take up the state for the scheduler's count ``target``; the choice, and the
        version to publish (on the leader): the whole weights, or the announcement of
        every rank's part. ``local``: the run is on this one host (the leader's word: a
        rank's part publisher serves on loopback only)."""
        if self.part_publisher is None and self.make_part_publisher is not None:
            index = self.learner.part_index()  # None: a copy that publishes nothing
            if index is not None:
                self.part_publisher = self.make_part_publisher(local, index)
        choice = restore(self.learner, self.store, self.checkpoints(), target, self.ranks)
        self.step = choice.step
        log.info(
            f"{'critic' if self.critic else 'trainer'} state restored",
            step=choice.step,
            source=str(choice.source),
            **({} if choice.checksum is None else {"checksum": choice.checksum}),
        )
        return choice, self._version_out()

    def checkpoints(self) -> dict[int, Path]:
        """This learner's checkpoint directories by step (the critic's are its own)."""
        run = self.run
        if self.critic:
            return {step: run.critic_checkpoint(step) for step in run.critic_checkpoint_steps()}
        return {step: run.checkpoint(step) for step in run.checkpoint_steps()}

    def train(self, groups: list[Group]) -> tuple[Any, dict[str, torch.Tensor]]:
        # The policy's first steps in a run with a critic's warmup: the critic learns alone.
        update = self.critic or self.step >= self.cfg.critic.warmup_steps
        started = time.perf_counter()
        # The step's number, not a counter of the learner's: a restarted rank's rate (and
        # mini-batch split) is the one its predecessor would have used.
        if update:
            stats = self.learner.step(groups, self.step)
        else:
            stats = self.learner.skip(groups, self.step)
        updated = time.perf_counter()
        self.step += 1
        self._stage()
        staged = time.perf_counter()
        weights = self._version_out()
        self.phases = {
            "update_s": updated - started,
            "stage_s": staged - updated,
            "gather_s": time.perf_counter() - staged,
        }
        return stats, weights

    def _version_out(self) -> dict[str, torch.Tensor] | Announcement:
        """What the leader publishes as the step's version (the others get nothing): the
        whole weights, gathered; or, with a part publisher, every publishing rank's part
        staged and served by that rank, and their announcements gathered into one (a
        collective: a rank that publishes nothing says so)."""
        if self.make_part_publisher is None and self.part_publisher is None:
            return self.learner.full_weights()
        # The part publisher was made at the restore, where this rank publishes a part.
        own = self.learner.own_part()
        announced = publish_parts(own, self.part_publisher, self.step, self.learner.rank == 0)
        return {} if announced is None else announced

    def _stage(self) -> None:
        started = time.perf_counter()
        crc = stage(self.learner, self.store, self.step)
        seconds = round(time.perf_counter() - started, 4)
        log.info("state staged", step=self.step, checksum=crc, seconds=seconds)

    def reserve(self) -> None:
        """Size the staging files now: a lack of room is an error at start, not mid-run."""
        reserve(self.learner, self.store)

    def finish(self, ended: bool) -> None:
        """Leaving: remove the staged state if the run's last step is done, else keep it."""
        if ended and self.step >= self.cfg.run.total_steps:
            self.store.remove()
            if self.cfg.algorithm.estimator == "gae":  # the critic's too: the run is done
                ranks = critic_ranks(self.cfg)
                for rank in range(ranks):
                    directory = self.run.critic_staged_state
                    StagedState(directory, rank, staged_identity(self.cfg, ranks)).remove()
        else:
            self.store.close()


def restore_body(target: int, local: bool = True) -> bytes:
    return msgpack.packb([target, local])


def publish_parts(
    own: OwnPart | None, publisher: WeightPublisher | None, version: int, leader: bool
) -> Announcement | None:
    """Publish this rank's part of ``version`` (``own``, None: it publishes nothing) and
    gather every publishing rank's announcement; the leader gets them as one (parts.py),
    the others None. A collective over the group: every rank calls it."""
    said = None
    if own is not None:
        assert publisher is not None
        mine = publisher.publish(version, own.tensors)
        shapes = None if own.shapes is None else {n: list(s) for n, s in own.shapes.items()}
        said = [own.index, mine.version, mine.manifest, mine.address, own.dims, shapes]
    # Plain data between the ranks (policy/collectives.py), never pickled.
    every = all_gather_data(said)
    if not leader:
        return None
    given = sorted((s for s in every if s is not None), key=lambda s: s[0])
    parts = [Announcement(v, manifest, address) for _, v, manifest, address, _, _ in given]
    # Each rank knows the dimensions of its own tensors only (a stage, its layers').
    dims = {str(n): int(d) for said in given for n, d in said[4].items()}
    known = given[0][5]
    shapes = (
        {str(n): tuple(s) for n, s in known.items()}
        if known is not None
        else whole_shapes(parts, dims)
    )
    return compose(version, parts, shapes, dims)
