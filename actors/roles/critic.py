"""The ``critic`` role: ready → critic_trained, one step of the critic per lease.

Consumes ``transition.*.ready`` (PPO's table, ``Pipeline.with_critic``); a lease is a
batch of groups with their responses, rewards and the values the ``values`` stage made
for them. The step: GAE's returns from those rewards and values, then the clipped value
loss towards them (:class:`~..critic.learner.CriticLearner`). Its own step count is the
critic's version, published as the policy's is; its metrics (the value loss, and how many
critic versions the values lagged its step: the critic's staleness) go into the next
line of ``metrics.jsonl``.

The critic stages its state after every step before the step's completion goes out, as
the trainer does (:class:`~..training.rank.TrainRank`, in its own directory), so a
``kill -9`` loses at most the step in flight: the restarted critic takes up exactly the
scheduler's critic step count. Each version's weights travel over the weight plane as
the policy's do, from a publisher of its own (``RunDir.critic_weight_dirs``), so its
values workers may run on any host.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np
import structlog

from asyncrl.runtime.config import RunConfig
from asyncrl.runtime.core.pipeline import Role
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import Announcement, make_publisher

from ..actor import Actor, ActorBroken, Outcome, WorkerContext
from ..critic import load_value_model
from ..critic.learner import CriticLearner, CriticStats
from ..training.group import Group
from ..training.rank import TrainRank
from ..worker.preflight import check_model

__all__ = ["Critic", "critic_path"]

log = structlog.get_logger("asyncrl.critic")


def critic_path(cfg: RunConfig) -> str:
    """The model directory the critic starts from (``critic.path``, else the policy's)."""
    return cfg.critic.path or cfg.model.path


class Critic(Actor):
    role: ClassVar[str] = Role.CRITIC.value
    publishes_versions: ClassVar[bool] = True
    follows_critic: ClassVar[bool] = True

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return check_model(cfg)

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = self.cfg = ctx.config
        model, codec = load_value_model(critic_path(cfg))
        c = cfg.critic
        learner = CriticLearner(model, cfg, codec.pad_id, lr=c.lr, clip=c.clip)
        self.rank = TrainRank(cfg, learner, 0, 1)
        self.rank.reserve()
        self.weights = make_publisher(cfg.weights, RunDir.of(cfg).critic_weight_dirs(cfg.weights))
        choice, self.newest = self.rank.restore(ctx.steps_done)  # the next publish's weights
        if choice.step != ctx.steps_done:
            # Its state lived in this host's memory only (no checkpoints): a lost host
            # loses the critic's steps, and the scheduler's count cannot go back for it.
            raise ActorBroken(
                f"the scheduler counts {ctx.steps_done} critic steps, the newest critic state "
                f"left is step {choice.step} ({choice.source}): the critic cannot resume"
            )
        self.weights.prepare(self.newest)  # its buffers made while the first step trains

    def process(self, lease: p.Lease) -> Outcome:
        if lease.version is not None and lease.version != self.rank.step:
            raise ActorBroken(
                f"leased a critic step from version {lease.version}, but this critic's state "
                f"is at step {self.rank.step}: another critic must have trained the steps between"
            )
        started = time.perf_counter()
        groups = [Group.of(item) for item in lease.items]
        stats, self.newest = self.rank.train(groups)
        metrics = _metrics(groups, stats, self.rank.step, time.perf_counter() - started)
        results = tuple(p.Result(g.gid, {"critic_trained_at": self.rank.step}) for g in groups)
        return Outcome(results, metrics, tokens=stats.tokens)

    def on_publish(self, version: int) -> Announcement:
        if version != self.rank.step:
            raise RuntimeError(f"asked to publish critic version {version}, at {self.rank.step}")
        return self.weights.publish(version, self.newest)

    def on_stop(self) -> None:
        try:
            self.weights.close()
        finally:
            self.rank.finish(ended=False)  # the policy's last step ends the run, not the critic's


def _metrics(groups: list[Group], stats: CriticStats, step: int, seconds: float) -> dict:
    """The critic's step: its loss, and how many critic versions the values it used lag
    the version it trained from (the critic's staleness, bounded by max_staleness)."""
    lags = [step - 1 - g.values.version for g in groups if g.values is not None]
    return {
        "value_loss": stats.value_loss,
        "value_clip_frac": stats.value_clip_frac,
        "critic_grad_norm": stats.grad_norm,
        "critic_staleness_mean": float(np.mean(lags)),
        "critic_staleness_max": int(max(lags)),
        "critic_groups": len(groups),
        "critic_step_s": round(seconds, 4),
    }
