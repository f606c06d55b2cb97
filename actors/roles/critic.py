"""The ``critic`` role: ready → critic_trained, one step of the critic per lease.

Consumes ``transition.*.ready`` (PPO's table, ``Pipeline.with_critic``); a lease is a
batch of groups with their responses, rewards and, with ``critic.values: stage``, the
values the ``values`` stage made for them; without that stage (``critic.values: step``,
the default) the step makes them, with the critic as it stands, and hands them on in its
result for the train step's advantages. The step: GAE's returns from those rewards and
values, then the clipped value loss towards them (:class:`~..critic.learner.CriticLearner`).
Its own step count is the critic's version, published as the policy's is; its metrics
(the value loss, and how many critic versions the values lagged its step: the critic's
staleness) go into the next line of ``metrics.jsonl``.

Like the trainer (:class:`~..training.learner_role.LearnerRole`) it runs as one process or
as a group of ``pipeline.workers.critic`` ranks (the value model sharded over them, rank 0
leading), and stages its state after every step before the step's completion goes out
(in its own directory), so a ``kill -9`` loses at most the step in flight. Every
``pipeline.checkpoint_every`` critic steps and when it stops it writes a checkpoint of its
own (``critic/step-N``: the value model in Hugging Face's names, ``model.*`` and
``score.*``, with its optimizer, RNG and counters), and on stop the critic as it stopped
(``critic/final``). A critic whose host was lost takes up its newest checkpoint and has
the scheduler roll the critic back to it (``_roll_back_critic``: only critic updates are
lost). Each version's weights travel over the weight plane as the policy's do, from the
leader's publisher of its own (``RunDir.critic_weight_dirs``), so its values workers may
run on any host.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import structlog
import torch

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import WeightDirs

from ..actor import Outcome, WorkerContext
from ..critic.learner import CriticLearner, CriticStats
from ..critic.model import frozen_layers_problem, layers_problem
from ..payloads import ValuesOut
from ..policy.checkpoint import model_dir, save_state
from ..startup.model_loading import load_critic
from ..startup.role_checks import check_device, check_model
from ..training.gang import Order
from ..training.group import Group
from ..training.learner_role import LearnerRole
from ..training.rank import TrainRank
from ..training.resume import resume_files

__all__ = ["Critic", "critic_path"]

log = structlog.get_logger("asyncrl.critic")


def critic_path(cfg: RunConfig) -> str:
    """The model directory the critic starts from (``critic.path``, else the policy's)."""
    return cfg.critic.path or cfg.model.path


class Critic(LearnerRole):
    role: ClassVar[str] = Role.CRITIC.value
    follows_critic: ClassVar[bool] = True
    learner: ClassVar[str] = "critic"
    step_name: ClassVar[str] = "critic step"
    metrics_prefix: ClassVar[str] = "critic"
    rolled_back: ClassVar[str] = "the critic"

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return [*check_device(cfg), *check_model(cfg), *_layer_problems(cfg)]

    def on_start(self, ctx: WorkerContext) -> None:
        self.source = model_dir(critic_path(ctx.config))
        self._join(ctx)

    @classmethod
    def weight_dirs(cls, cfg: RunConfig) -> WeightDirs:
        return RunDir.of(cfg).critic_weight_dirs(cfg.weights)

    def _new_rank(self, cfg: RunConfig, rank: int, ranks: int, index: int | None) -> TrainRank:
        model, codec = load_critic(cfg, self.role, index, critic_path(cfg))
        log.info(
            "value model loaded",
            device=str(next(model.parameters()).device),
            rank=rank,
            ranks=ranks,
            threads=torch.get_num_threads(),
        )
        c = cfg.critic
        learner = CriticLearner(model, cfg, codec.pad_id, lr=c.lr, clip=c.clip, group_size=ranks)
        return TrainRank(cfg, learner, rank, ranks)

    def process(self, lease: p.Lease) -> Outcome:
        started = time.perf_counter()
        groups, stats = self._train(lease)
        seconds = time.perf_counter() - started
        metrics = _metrics(groups, stats, self.step)
        if self.gang is not None:
            metrics["critic_ranks"] = self.gang.size
        saving = time.perf_counter()
        if self._checkpoint_due():
            self.save_checkpoint()
        metrics |= self._step_phases(seconds, time.perf_counter() - saving)
        made = stats.made or [None] * len(groups)
        results = tuple(
            p.Result(g.gid, _result(self.step, v)) for g, v in zip(groups, made, strict=True)
        )
        return Outcome(results, metrics, tokens=stats.tokens)

    # --- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self) -> Path:
        weights, optimizer = self._together(Order.GATHER)
        target = self.run.critic_checkpoint(self.step)
        counters = {"critic_step": self.step, "critic_version": self.step}
        extra = resume_files(self.step, optimizer, counters)
        save_state(self.rank.learner.model.config, weights, self.source, target, extra)
        self.saved_step = self.step
        log.info("critic checkpoint written", step=self.step, path=str(target))
        self._keep_newest_checkpoints()
        return target

    def on_stop(self) -> None:
        try:
            if self.resumed and self.step > 0 and not self._broken:
                # The run's end is the policy's last step, which the critic does not see:
                # the critic as it stops is the final one when the run is over.
                final = self.run.final_critic
                save_state(self.rank.learner.model.config, self._whole_weights(), self.source,
                           final)  # fmt: skip
                log.info("final critic written", step=self.step, path=str(final))
        finally:
            super().on_stop()


def _layer_problems(cfg: RunConfig) -> list[str]:
    """``critic.layers`` asks for no more layers than the critic's directory has, and
    ``critic.frozen_layers`` leaves one of those it keeps to learn."""
    c = cfg.critic
    if c.layers == 0 and c.frozen_layers == 0:
        return []
    try:
        config = json.loads((model_dir(critic_path(cfg)) / "config.json").read_text())
    except (OSError, ValueError):
        return []  # the directory's own check says what is wrong with it
    available = config.get("num_hidden_layers")
    if not isinstance(available, int):
        return []
    problem = layers_problem(c.layers, available)
    if problem is None:
        problem = frozen_layers_problem(c.frozen_layers, c.layers or available)
    return [] if problem is None else [problem]


def _result(step: int, values: np.ndarray | None) -> p.Payload:
    """What the step hands on for a group: the step it was trained at, and the values the
    step made for it (no values stage), at the version it trained from, for the train
    step's advantages."""
    if values is None:
        return {"critic_trained_at": step}
    return {"critic_trained_at": step, **ValuesOut(values, step - 1).to_payload()}


def _metrics(groups: list[Group], stats: CriticStats, step: int) -> dict:
    """The critic's step: its loss, and how many critic versions the values it used lag
    the version it trained from (the critic's staleness, bounded by max_staleness; 0 when
    the step made them)."""
    lags = [step - 1 - g.values.version for g in groups if g.values is not None] or [0]
    return {
        "value_loss": stats.value_loss,
        "value_clip_frac": stats.value_clip_frac,
        "critic_grad_norm": stats.grad_norm,
        "critic_grad_norm_max": stats.grad_norm_max,
        "critic_lr": stats.lr,
        "critic_updates": stats.updates,
        "critic_staleness_mean": float(np.mean(lags)),
        "critic_staleness_max": int(max(lags)),
        "critic_groups": len(groups),
    }
