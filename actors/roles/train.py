"""The ``train`` role: ready → trained, one train step per lease, then a new version.

Consumes ``transition.*.ready``; a lease is one step's batch (``pipeline.train_batch_groups``
groups), with what every earlier role left: prompts, responses with behaviour log-probs
and versions, proximal log-probs (logp), reference log-probs (ref_logp), rewards. The
step: group-normalised advantages, then ``algorithm.mini_batches`` x ``epochs`` updates
(one by default), each the decoupled PPO-clip loss over its micro-batches (gradients
accumulated), gradient clipping and AdamW at the step's scheduled rate. Its metrics go
with the completion into the run's ``metrics.jsonl``.

Every rank stages its state after each step in host shared memory (:mod:`..training.staged_state`)
before the step's completion goes out, so the scheduler never counts a step whose state
could be lost with the trainer's process; a restarted trainer resumes at exactly the
scheduler's step count, or has the scheduler roll back to the newest state left
(:mod:`..training.resume`). A lease for another step than the trainer's is an error: two trainers.

After each step the worker asks to publish the new version: ``on_publish`` hands the
weights to the weight plane first, so a generator told of version v can fetch it. Every
``pipeline.checkpoint_every`` steps, when it stops, and after the last step, it writes a
checkpoint in Hugging Face format with the optimizer, RNG and counters beside it: the
state that survives the loss of the host (``Outcome.durable_step``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

import numpy as np
import structlog

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import WeightDirs

from ..actor import Outcome, WorkerContext
from ..policy.checkpoint import model_dir, save_state
from ..policy.lora import save_adapter_checkpoint, save_final
from ..rollout_dump import RolloutDump
from ..startup.model_loading import load_policy
from ..startup.role_checks import check_device, check_engine, check_lora, check_model
from ..startup.router_replay import router_replay_problems
from ..training.gang import Order
from ..training.learner import Group, Learner, StepStats
from ..training.learner_role import LearnerRole
from ..training.mismatch import step_mismatch
from ..training.rank import TrainRank
from ..training.resume import resume_files

__all__ = ["Train"]

log = structlog.get_logger("asyncrl.train")


class Train(LearnerRole):
    role: ClassVar[str] = Role.TRAIN.value
    learner: ClassVar[str] = "trainer"
    step_name: ClassVar[str] = "step"
    metrics_prefix: ClassVar[str] = "train"
    rolled_back: ClassVar[str] = "the run"
    ends_run: ClassVar[bool] = True

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        problems = [*check_engine(cfg, cls.role), *check_device(cfg), *check_model(cfg)]
        problems += router_replay_problems(cfg, cls.role)
        return problems or check_lora(cfg)  # the targets are checked on a model that loads

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = ctx.config
        self.source = model_dir(cfg.model.path)
        self._join(ctx)
        self._took_up()

    def _took_up(self) -> None:
        # The dump's lines of the steps trained again must supersede the lost ones: a new
        # writer orders them as a restarted trainer's.
        self.dump = RolloutDump.of(self.cfg, self.ctx.worker)
        self.resumed_at = self.step

    @classmethod
    def weight_dirs(cls, cfg: RunConfig) -> WeightDirs:
        return RunDir.of(cfg).weight_dirs(cfg.weights)

    def _new_rank(self, cfg: RunConfig, rank: int, ranks: int, index: int | None) -> TrainRank:
        model, codec = load_policy(cfg, self.role, index)
        return TrainRank(cfg, Learner(model, cfg, codec.pad_id, ranks), rank, ranks)

    # --- a step --------------------------------------------------------------------------

    def process(self, lease: p.Lease) -> Outcome:
        started = time.perf_counter()
        groups, stats = self._train(lease)
        seconds = time.perf_counter() - started
        metrics = self._metrics(groups, stats, seconds)
        metrics["keys"] = [item.key for item in lease.items]  # the data this step consumed
        # Before the completion goes out: a step the scheduler counts has its lines.
        values = None if groups[0].values is None else [g.values.values for g in groups]
        self.dump.trained(self.step, self.resumed_at, lease.items, self.cfg.algorithm, values)
        saving = time.perf_counter()
        if self._checkpoint_due() or self._last_step:
            self.save_checkpoint()
        if self._last_step:
            self._save_final()
        metrics |= self._step_phases(seconds, time.perf_counter() - saving)
        results = tuple(p.Result(g.gid, {"trained_at": self.step}) for g in groups)
        return Outcome(results, metrics, tokens=stats.tokens, durable_step=self.durable)

    @property
    def _last_step(self) -> bool:
        return self.step >= self.cfg.run.total_steps

    # --- metrics -------------------------------------------------------------------------

    def _metrics(self, groups: list[Group], stats: StepStats, seconds: float) -> dict:
        rewards = np.stack([g.rewards for g in groups])
        lengths = np.concatenate([g.rollouts.lengths for g in groups])
        trained_from = self.step - 1
        staleness = [trained_from - g.rollouts.behaviour()[0] for g in groups]
        return {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            # groups whose responses were all paid alike: no advantage, nothing learned
            "groups_no_spread": int(sum(np.ptp(g.rewards) == 0 for g in groups)),
            "response_len_mean": float(lengths.mean()),
            "response_len_max": int(lengths.max()),
            "truncated_frac": float(np.mean([g.rollouts.truncated.mean() for g in groups])),
            **_reward_parts(groups),
            "staleness_mean": float(np.mean(staleness)),
            "staleness_max": int(max(staleness)),
            **stats.metrics,
            **step_mismatch(groups),
            "grad_norm": stats.grad_norm,
            "train_tokens_per_s": round(stats.tokens / seconds, 1),
            **({"train_ranks": self.gang.size} if self.gang else {}),
        }

    # --- versions and checkpoints --------------------------------------------------------

    def save_checkpoint(self) -> Path:
        weights, optimizer = self._together(Order.GATHER)
        target = self.run.checkpoint(self.step)
        counters = {"step": self.step, "policy_version": self.step}
        extra = resume_files(self.step, optimizer, counters)
        if self.cfg.model.lora.enabled:  # the adapters alone: the base is model.path's
            save_adapter_checkpoint(self.cfg.model.lora, weights, self.source, target, extra)
        else:
            save_state(self.rank.learner.model.config, weights, self.source, target, extra)
        self.saved_step = self.durable = self.step
        log.info("checkpoint written", step=self.step, path=str(target))
        self._keep_newest_checkpoints()
        return target

    def _save_final(self) -> None:
        learner = self.rank.learner
        config, lora, final = learner.model.config, self.cfg.model.lora, self.run.final_model
        weights = self._whole_weights()
        if lora.enabled:
            save_final(config, lora, weights, self.source, final, learner.compute_dtype)
        else:
            save_state(config, weights, self.source, final)
        log.info("final model written", step=self.step, path=str(self.run.final_model))


def _reward_parts(groups: list[Group]) -> dict[str, float]:
    """Each reward part's mean beside the reward's (``reward_task_mean``,
    ``reward_overlong_mean``), when the rewards have more than one part."""
    parts = [g.reward_parts or {} for g in groups]
    names = set.intersection(*(set(p) for p in parts))
    if len(names) < 2:
        return {}
    return {f"reward_{n}_mean": float(np.mean([p[n] for p in parts])) for n in sorted(names)}
