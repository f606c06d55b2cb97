"""A role whose learner is one process or a group of ranks led by rank 0: the trainer
(``train``) and the learned critic (``critic``).

What both do alike is here: joining the group the launcher placed this process in,
carrying out an order with every rank (:meth:`LearnerRole._together`), taking up the state
for the scheduler's count at start through the group (and having the scheduler roll its
count back where only an older state is left), a step on a lease, checkpoints every
``pipeline.checkpoint_every`` steps and on stop, the other ranks' loop
(:meth:`LearnerRole.follow`), and leaving. A role says how its rank is built
(``_new_rank``), what its checkpoint holds (``save_checkpoint``) and how messages name it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import structlog
import torch

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.gangs import GangPlace
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.whole_dirs import remove_directory
from asyncrl.transport import protocol as p
from asyncrl.transport.identity import RunSecretError, load_run_secret
from asyncrl.transport.weights import (
    Announcement,
    WeightDirs,
    WeightPublisher,
    WeightsAccess,
    make_publisher,
    weights_key,
)

from ..actor import Actor, ActorBroken, WorkerContext
from ..startup.router_replay import replays_routes
from ..worker.weight_following import weights_access
from .gang import Gang, Order, join_group, join_group_at, pack_lease, unpack_lease
from .group import Group
from .rank import TrainRank, restore_body

__all__ = ["LearnerRole"]


class LearnerRole(Actor):
    """The shared part of the trainer and the critic (see the module)."""

    publishes_versions: ClassVar[bool] = True
    learner: ClassVar[str]  # how messages name it: "trainer", "critic"
    step_name: ClassVar[str]  # how messages name its steps: "step", "critic step"
    metrics_prefix: ClassVar[str]  # its step metrics' names: "train_step_s", "critic_step_s"
    rolled_back: ClassVar[str]  # what rolling its count back rolls back: "the run"
    # Its stop ends the run's staged state once the last step is done (the trainer's);
    # the critic's stop does not: the policy's last step ends the run.
    ends_run: ClassVar[bool] = False

    cfg: RunConfig
    ctx: WorkerContext
    run: RunDir
    gang: Gang | None
    rank: TrainRank

    def _new_rank(self, cfg: RunConfig, rank: int, ranks: int, index: int | None) -> TrainRank:
        """This process's rank of ``ranks``, its learner at the base model."""
        raise NotImplementedError

    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the current step (every rank joins in its gather)."""
        raise NotImplementedError

    @property
    def log(self) -> Any:
        return structlog.get_logger(f"asyncrl.{self.role}")

    # --- starting ------------------------------------------------------------------------

    @classmethod
    def weight_dirs(cls, cfg: RunConfig) -> WeightDirs:
        """Where its versions' weights are kept for receivers (the weight plane's files)."""
        raise NotImplementedError

    def _join(self, ctx: WorkerContext) -> None:
        """Join the group (if any), build this rank and take up the state to resume from.
        The leader publishes its versions' weights from a publisher of its own; with
        ``weights.from_every_rank`` in a group, every rank publishes its part of each from
        its own, and the leader announces them together (transport/weights/parts.py)."""
        self.cfg, self.ctx = ctx.config, ctx
        self.run = RunDir.of(self.cfg)
        self.gang = join_group(self.cfg, self.role)
        rank, ranks = (self.gang.rank, self.gang.size) if self.gang else (0, 1)
        self.rank = self._new_rank(
            self.cfg, rank, ranks, self.gang.rank if self.gang else ctx.index
        )
        dirs, access = self.weight_dirs(self.cfg), weights_access(ctx)
        in_parts = ranks > 1 and self.cfg.weight_parts(self.role) > 1  # rank 0: part 0
        self.weights = make_publisher(self.cfg.weights, dirs.of_rank(0) if in_parts else dirs,
                                      access)  # fmt: skip
        if in_parts:
            self.rank.part_publisher = self.weights
        self.rank.reserve()
        # What the next publish hands over: the whole weights, or the parts' announcement.
        self.newest: dict[str, torch.Tensor] | Announcement = {}
        self.resumed = False
        self.saved_step = self.durable = 0  # the newest checkpoint written / on disk
        self._resume(ctx.steps_done)
        if isinstance(self.newest, dict):
            # Its buffers are made while the first step trains, not when that step
            # publishes; from the whole weights the restore gathered (a split model has
            # none before).
            self.weights.prepare(self.newest)

    @property
    def step(self) -> int:
        return self.rank.step

    def _resume(self, target: int) -> None:
        """Take up the state for the scheduler's count ``target`` (every rank the same);
        if only an older one is left, have the scheduler roll back to it."""
        body = restore_body(target, self.ctx.local)
        choice, self.newest = self._together(Order.RESTORE, body=body)
        self.resumed = True
        self.saved_step = choice.step
        self.durable = max((s for s in self.rank.checkpoints() if s <= choice.step), default=0)
        if choice.step == target:
            return
        self.log.warning(
            f"the {self.learner}'s state is older than the scheduler's {self.step_name} "
            f"count: rolling {self.rolled_back} back from step {target} to step {choice.step}",
            scheduler_steps=target,
            source=str(choice.source),
            **{f"{self.learner}_step": choice.step},
        )
        try:
            if self.ctx.rewind is None:
                raise RuntimeError("this worker cannot ask the scheduler to roll back")
            self.ctx.rewind(choice.step)
        except RuntimeError as error:  # refused, or this worker cannot ask
            raise ActorBroken(
                f"the scheduler counts {target} {self.step_name}s, the newest state left is "
                f"step {choice.step} ({choice.source}), and rolling back failed: {error}"
            ) from error

    # --- steps ---------------------------------------------------------------------------

    def _train(self, lease: p.Lease) -> tuple[list[Group], Any]:
        """One step on ``lease`` with every rank: its groups and the step's stats. Every
        rank stages its state after the step before the step can count (TrainRank)."""
        if lease.version is not None and lease.version < self.step:
            self._behind_the_scheduler(lease.version)
        if lease.version is not None and lease.version != self.step:
            raise ActorBroken(
                f"leased a {self.step_name} from version {lease.version}, but this "
                f"{self.learner}'s state is at step {self.step}: another {self.learner} must "
                "have trained the steps between"
            )
        replay = replays_routes(self.cfg, self.role)
        groups = [Group.of(item, routes=replay) for item in lease.items]
        body = pack_lease(lease) if self.gang is not None else b""
        stats, self.newest = self._together(Order.STEP, groups, body)
        return groups, stats

    def _step_phases(self, step_s: float, checkpoint_s: float) -> dict[str, float]:
        """Where the step's ``step_s`` seconds went (TrainRank.phases), with the checkpoint
        written after it (0 when none was due), as metrics: ``train_update_s``, ..."""
        phases = {**self.rank.phases, "checkpoint_s": checkpoint_s}
        return {
            f"{self.metrics_prefix}_step_s": round(step_s, 4),
            **{f"{self.metrics_prefix}_{name}": round(s, 4) for name, s in phases.items()},
        }

    def _behind_the_scheduler(self, counted: int) -> None:
        """The scheduler counts ``counted`` steps, fewer than this state's: it lost the
        record of the steps after (its host died before they were journaled). Take up the
        state for its count in place, as a restart of this process would."""
        self.log.warning(
            f"the scheduler counts {counted} {self.step_name}s and this {self.learner} is "
            f"at step {self.step}: its record of the steps after was lost; taking up the "
            f"state of step {counted}",
            scheduler_steps=counted,
            **{f"{self.learner}_step": self.step},
        )
        self._resume(counted)
        self._took_up()

    def _took_up(self) -> None:
        """After a state was taken up in place: what the role keeps per take-up."""

    def _together(self, order: Order, groups: list[Group] | None = None, body: bytes = b""):
        """Carry out ``order`` with every rank of the group (alone: just carry it out).

        A broken group exits (GangBroken) and starts afresh from the staged state."""
        work = partial(self.rank.carry_out, order, groups, body)
        return work() if self.gang is None else self.gang.lead(order, work, body)

    def _whole_weights(self) -> dict[str, torch.Tensor]:
        """The current version's weights whole, on the leader: those it publishes, or,
        where every rank publishes its part, gathered now (every rank joins)."""
        if isinstance(self.newest, dict):
            return self.newest
        weights, _ = self._together(Order.GATHER)
        return weights

    def on_publish(self, version: int) -> Announcement:
        if version != self.step:
            raise RuntimeError(
                f"asked to publish {self.learner} version {version}, the model is at {self.step}"
            )
        if isinstance(self.newest, Announcement):  # every rank's part, published already
            return self.newest
        return self.weights.publish(version, self.newest)

    def _checkpoint_due(self) -> bool:
        return self.step % self.cfg.pipeline.checkpoint_every == 0

    def _keep_newest_checkpoints(self) -> None:
        """After a checkpoint: delete all but the newest ``run.keep_checkpoints`` (0: all
        kept)."""
        keep, saved = self.cfg.run.keep_checkpoints, self.rank.checkpoints()
        old = sorted(saved)[:-keep] if keep else []
        for step in old:
            remove_directory(saved[step])
        if old:
            self.log.info("old checkpoints deleted", steps=old, kept=keep)

    # --- stopping ------------------------------------------------------------------------

    @property
    def _broken(self) -> bool:
        return self.gang is not None and self.gang.broken

    def on_stop(self) -> None:
        try:
            if self.resumed and self.step > self.saved_step and not self._broken:
                self.save_checkpoint()
        finally:
            self._release()
            self.rank.finish(ended=self.ends_run and not self._broken)
            if self.gang is not None:
                self.gang.leave()

    def _release(self) -> None:
        """Let go of what the role holds beside its rank: its weight publisher."""
        self.weights.close()

    # --- the other ranks of a group -----------------------------------------------------

    def follow(self, cfg: RunConfig, place: GangPlace) -> int:
        """Serve as rank ``place.rank`` > 0: do what the leader orders until it stops."""
        gang = join_group_at(cfg, place, self.role)
        rank: TrainRank | None = None
        try:
            rank = self._new_rank(cfg, place.rank, place.size, place.rank)
            if cfg.weight_parts(self.role) > 1:
                rank.make_part_publisher = partial(self._part_publisher, cfg)
            rank.reserve()
            while True:
                order, body = gang.next_order()
                if order is Order.STOP:
                    rank.finish(ended=self.ends_run)
                    return 0
                groups = None
                if order is Order.STEP:
                    replay = replays_routes(cfg, self.role)
                    groups = [Group.of(item, routes=replay) for item in unpack_lease(body).items]
                rank.carry_out(order, groups, body)
        finally:
            if rank is not None and rank.part_publisher is not None:
                rank.part_publisher.close()
            gang.close()

    def _part_publisher(self, cfg: RunConfig, local: bool, index: int) -> WeightPublisher:
        """A follower's publisher of its part ``index`` of each version (the run's key from
        its secret, as the leader's; on loopback only when the leader says the run is on
        one host)."""
        try:
            key = weights_key(load_run_secret(RunDir.of(cfg).secret))
        except (OSError, RunSecretError) as error:
            raise ActorBroken(f"part {index} of a version cannot be signed: {error}") from error
        dirs = self.weight_dirs(cfg).of_rank(index)
        return make_publisher(cfg.weights, dirs, WeightsAccess(local=local, key=key))
