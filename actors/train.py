"""The ``train`` role: ready → trained, one optimizer step per lease, then a new version.

Consumes ``transition.*.ready``; a lease is one step's batch (``pipeline.train_batch_groups``
groups), with what every earlier role left: prompts, responses with behaviour log-probs
and versions, proximal log-probs (logp), reference log-probs (ref_logp), rewards. The
step: group-normalised advantages, then the decoupled PPO-clip loss over micro-batches
(gradients accumulated), gradient clipping, AdamW. Its metrics go with the completion
into the run's ``metrics.jsonl``.

After each step the worker asks to publish the new version: ``on_publish`` hands the
weights to the weight plane first, so a generator told of version v can fetch it. Every
``pipeline.checkpoint_every`` steps, when it stops, and after the last step, it writes a
checkpoint in Hugging Face format with the optimizer, RNG and counters beside it.
"""

from __future__ import annotations

import io
import json
import time
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import structlog
import torch
from safetensors.torch import load_file

from asyncrl.runtime.config import RunConfig
from asyncrl.runtime.core.pipeline import Role
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import Announcement, make_publisher

from ._learner import Group, Learner, StepStats
from ._setup import load_policy
from .actor import Actor, Outcome, WorkerContext
from .gang import (
    Gang,
    GangPlace,
    Order,
    join_group,
    join_group_at,
    pack_lease,
    unpack_lease,
)
from .policy.checkpoint import load_state, model_dir, save_state, state_for_saving
from .policy.model import CausalLM
from .preflight import check_device, check_engine, check_model

__all__ = ["Train"]

log = structlog.get_logger("asyncrl.train")

TRAINER_STATE = "trainer_state.pt"


class Train(Actor):
    role: ClassVar[str] = Role.TRAIN.value
    publishes_versions: ClassVar[bool] = True

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return [*check_engine(cfg, cls.role), *check_device(cfg), *check_model(cfg)]

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = self.cfg = ctx.config
        self.run = RunDir.of(cfg)
        self.source = model_dir(cfg.model.path)
        self.gang = join_group(cfg)
        model, self.codec = load_policy(cfg, self.role, self.gang.rank if self.gang else ctx.index)
        self.weights = make_publisher(cfg.weights, self.run.weight_dirs(cfg.weights))
        # Its buffers are made while the first step trains, not when that step publishes.
        self.weights.prepare({name: t.cpu() for name, t in state_for_saving(model).items()})
        self.learner, self.step, self.newest = _learner(
            cfg, model, self.codec.pad_id, self.gang, self.run
        )  # newest: the weights the next publish hands over, whole
        self.saved_step = self.step

    # --- a step --------------------------------------------------------------------------

    def process(self, lease: p.Lease) -> Outcome:
        self._catch_up(lease.version)
        started = time.perf_counter()
        groups = [Group.of(item) for item in lease.items]
        body = pack_lease(lease) if self.gang is not None else b""
        stats, self.newest = self._together(Order.STEP, groups, body)
        self.step += 1
        seconds = time.perf_counter() - started
        metrics = self._metrics(groups, stats, seconds)
        metrics["keys"] = [item.key for item in lease.items]  # the data this step consumed
        if self.step % self.cfg.pipeline.checkpoint_every == 0 or self._last_step:
            self.save_checkpoint()
        if self._last_step:
            self._save_final()
        results = tuple(p.Result(g.gid, {"trained_at": self.step}) for g in groups)
        return Outcome(results, metrics, tokens=stats.tokens)

    def _together(self, order: Order, groups: list[Group] | None = None, body: bytes = b""):
        """Carry out ``order`` with every rank of the group (alone: just carry it out).

        A broken group exits (GangBroken) and starts afresh from the last checkpoint."""
        work = partial(_carry_out, self.learner, order, groups)
        return work() if self.gang is None else self.gang.lead(order, work, body)

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
            "response_len_mean": float(lengths.mean()),
            "response_len_max": int(lengths.max()),
            "truncated_frac": float(np.mean([g.rollouts.truncated.mean() for g in groups])),
            "staleness_mean": float(np.mean(staleness)),
            "staleness_max": int(max(staleness)),
            **stats.metrics,
            **_mismatch(groups),
            "grad_norm": stats.grad_norm,
            "train_tokens_per_s": round(stats.tokens / seconds, 1),
            "train_step_s": round(seconds, 4),
            **({"train_ranks": self.gang.size} if self.gang else {}),
        }

    # --- versions and checkpoints --------------------------------------------------------

    def on_publish(self, version: int) -> Announcement:
        if version != self.step:
            raise RuntimeError(f"asked to publish version {version}, the model is at {self.step}")
        return self.weights.publish(version, self.newest)

    def on_stop(self) -> None:
        broken = self.gang is not None and self.gang.broken
        try:
            if self.step > self.saved_step and not broken:
                self.save_checkpoint()
        finally:
            self.weights.close()
            if self.gang is not None:
                self.gang.leave()

    def save_checkpoint(self) -> Path:
        weights, optimizer = self._together(Order.GATHER)
        target = self.run.checkpoint(self.step)
        buffer = io.BytesIO()
        torch.save(
            {"step": self.step, "optimizer": optimizer, "torch_rng": torch.get_rng_state()},
            buffer,
        )
        counters = json.dumps({"step": self.step, "policy_version": self.step}).encode()
        save_state(
            self.learner.model.config,
            weights,
            self.source,
            target,
            extra={TRAINER_STATE: buffer.getvalue(), "counters.json": counters},
        )
        self.saved_step = self.step
        log.info("checkpoint written", step=self.step, path=str(target))
        return target

    def _save_final(self) -> None:
        config = self.learner.model.config
        save_state(config, self.newest, self.source, self.run.final_model)
        log.info("final model written", step=self.step, path=str(self.run.final_model))

    def _catch_up(self, scheduler_steps: int | None) -> None:
        """Meet the scheduler's step count if it ran ahead of the last checkpoint."""
        if scheduler_steps is None or scheduler_steps == self.step:
            return
        # The weights of steps after the last checkpoint died with the old trainer (its
        # staging buffers were the only copy it kept): go on from the checkpoint's.
        log.warning(
            "the trainer's step differs from the scheduler's; continuing from the last "
            "checkpoint's weights with the scheduler's step count",
            trainer_step=self.step,
            scheduler_steps=scheduler_steps,
        )
        self.step = scheduler_steps

    # --- the other ranks of a group -----------------------------------------------------

    def follow(self, cfg: RunConfig, place: GangPlace) -> int:
        """Serve as rank ``place.rank`` > 0: do what the leader orders until it stops."""
        gang = join_group_at(cfg, place)
        try:
            model, codec = load_policy(cfg, self.role, place.rank)
            learner, _step, _weights = _learner(cfg, model, codec.pad_id, gang, RunDir.of(cfg))
            while True:
                order, body = gang.next_order()
                if order is Order.STOP:
                    return 0
                groups = None
                if order is Order.STEP:
                    groups = [Group.of(item) for item in unpack_lease(body).items]
                _carry_out(learner, order, groups)
        finally:
            gang.close()


def _learner(
    cfg: RunConfig, model: CausalLM, pad_id: int, gang: Gang | None, run: RunDir
) -> tuple[Learner, int, dict[str, torch.Tensor]]:
    """This rank's learner, from the last checkpoint if there is one; its step; and the
    whole weights (on the leader; a collective in a group, so every rank calls it)."""
    checkpoint = run.latest_checkpoint()
    state = None
    if checkpoint is not None:
        # Whole weights into the whole model first: sharding then keeps each rank's part.
        load_state(model, load_file(str(checkpoint / "model.safetensors")))
        state = torch.load(checkpoint / TRAINER_STATE, weights_only=True)
    learner = Learner(model, cfg, pad_id, gang.size if gang else 1)
    step = 0
    if state is not None:
        learner.load_optimizer_state(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        step = int(state["step"])
        log.info("resumed from a checkpoint", step=step, path=str(checkpoint))
    return learner, step, learner.full_weights()


def _carry_out(learner: Learner, order: Order, groups: list[Group] | None) -> Any:
    """An order's work, the same sequence of collectives on every rank."""
    if order is Order.STEP:
        assert groups is not None
        return learner.step(groups), learner.full_weights()
    if order is Order.GATHER:
        return learner.full_weights(), learner.full_optimizer_state()
    raise ValueError(f"no work for order {order}")


def _mismatch(groups: list[Group]) -> dict:
    """Behaviour vs proximal log-probs on tokens both computed with the same version."""
    diffs = []
    for g in groups:
        r, version = g.rollouts, g.proximal.version
        mask = np.arange(r.versions.shape[1])[None] < r.lengths[:, None]
        same = mask & (r.versions == version)
        diffs.append(np.abs(r.logprobs - g.proximal.logprobs)[same])
    joined = np.concatenate(diffs) if diffs else np.zeros(0)
    if joined.size == 0:
        return {"same_version_tokens": 0}
    return {"same_version_tokens": int(joined.size), "logprob_mismatch": float(joined.mean())}
