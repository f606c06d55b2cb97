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
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import structlog
import torch
from safetensors.torch import load_file

from asyncrl.runtime.core.pipeline import Role
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import Announcement, make_publisher

from ._setup import load_policy
from .actor import Actor, Outcome, WorkerContext
from .payloads import LogprobsOut, RewardsOut, RolloutsOut
from .policy.checkpoint import load_state, model_dir, save_model, state_for_saving
from .policy.scoring import pack, response_logprobs
from .rl import LossConfig, group_advantages, loss_metrics, policy_loss

__all__ = ["Train"]

log = structlog.get_logger("asyncrl.train")

TRAINER_STATE = "trainer_state.pt"


@dataclass(frozen=True)
class _Group:
    gid: int
    rollouts: RolloutsOut
    proximal: LogprobsOut
    reference: LogprobsOut | None  # None: no ref_logp stage ran (algorithm.kl_coef is 0)
    rewards: np.ndarray

    @classmethod
    def of(cls, item: p.Item) -> _Group:
        return cls(
            gid=item.gid,
            rollouts=RolloutsOut.of(item),
            proximal=LogprobsOut.of(item, Role.LOGP),
            reference=LogprobsOut.of(item, Role.REF_LOGP) if Role.REF_LOGP in item.data else None,
            rewards=RewardsOut.of(item).rewards,
        )


class Train(Actor):
    role: ClassVar[str] = Role.TRAIN.value
    publishes_versions: ClassVar[bool] = True

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = self.cfg = ctx.config
        self.run = RunDir.of(cfg)
        self.model, self.codec = load_policy(cfg, self.role)
        self.source = model_dir(cfg.model.path)
        self.weights = make_publisher(cfg.weights, self.run.weight_dirs(cfg.weights))
        # Its buffers are made while the first step trains, not when that step publishes.
        self.weights.prepare(state_for_saving(self.model))
        a = cfg.algorithm
        self.loss_config = LossConfig(
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            is_cap=a.is_cap,
            kl_coef=a.kl_coef,
            kl_estimator=a.kl_estimator,
            loss_agg=a.loss_agg,
            estimator=a.estimator,
        )
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0
        )
        self.step = 0  # optimizer steps taken: the version the model holds
        self.saved_step = 0
        checkpoint = self.run.latest_checkpoint()
        if checkpoint is not None:
            self._restore(checkpoint)

    # --- a step --------------------------------------------------------------------------

    def process(self, lease: p.Lease) -> Outcome:
        self._catch_up(lease.version)
        started = time.perf_counter()
        groups = [_Group.of(item) for item in lease.items]
        rewards = torch.from_numpy(np.stack([g.rewards for g in groups]))
        advantages = group_advantages(rewards, self.cfg.algorithm.estimator)
        stats, tokens = self._accumulate(groups, advantages)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.cfg.algorithm.max_grad_norm
        )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        seconds = time.perf_counter() - started
        metrics = self._metrics(groups, rewards, stats, grad_norm, tokens, seconds)
        metrics["keys"] = [item.key for item in lease.items]  # the data this step consumed
        if self.step % self.cfg.pipeline.checkpoint_every == 0 or self._last_step:
            self.save_checkpoint()
        if self._last_step:
            self._save_final()
        results = tuple(p.Result(g.gid, {"trained_at": self.step}) for g in groups)
        return Outcome(results, metrics, tokens=tokens)

    def _accumulate(self, groups: list[_Group], advantages: torch.Tensor):
        self.model.train()
        per_micro = self.cfg.algorithm.micro_batch_groups
        total_tokens = int(sum(g.rollouts.lengths.sum() for g in groups))
        total_sequences = sum(len(g.rollouts.lengths) for g in groups)
        parts, total_loss = [], 0.0
        for first in range(0, len(groups), per_micro):
            chunk = groups[first : first + per_micro]
            loss, part = self._micro_batch(
                chunk, advantages[first : first + per_micro], total_tokens, total_sequences
            )
            loss.backward()
            parts.append(part)
            total_loss += loss.item()
        return {"loss": total_loss, **loss_metrics(parts)}, total_tokens

    def _micro_batch(self, groups, advantages, total_tokens: int, total_sequences: int):
        prompts, responses = [], []
        for g in groups:
            for response in g.rollouts.responses():
                prompts.append(g.rollouts.prompt_ids.tolist())
                responses.append(response)
        packed = pack(prompts, responses, self.codec.pad_id)
        width = packed.mask.shape[1]
        logp = response_logprobs(self.model, packed, self.cfg.algorithm.temperature)
        return policy_loss(
            logp,
            _rows(groups, lambda g: g.proximal.logprobs, width),
            _rows(groups, lambda g: g.rollouts.logprobs, width),
            advantages.reshape(-1),
            packed.mask,
            self.loss_config,
            ref_logp=_reference_rows(groups, width),
            total_tokens=total_tokens,
            total_sequences=total_sequences,
            max_len=self.cfg.model.max_new_tokens,
        )

    @property
    def _last_step(self) -> bool:
        return self.step >= self.cfg.run.total_steps

    # --- metrics -------------------------------------------------------------------------

    def _metrics(self, groups, rewards, stats, grad_norm, tokens: int, seconds: float) -> dict:
        lengths = np.concatenate([g.rollouts.lengths for g in groups])
        trained_from = self.step - 1
        staleness = [trained_from - g.rollouts.behaviour()[0] for g in groups]
        return {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(unbiased=False)),
            "response_len_mean": float(lengths.mean()),
            "response_len_max": int(lengths.max()),
            "truncated_frac": float(np.mean([g.rollouts.truncated.mean() for g in groups])),
            "staleness_mean": float(np.mean(staleness)),
            "staleness_max": int(max(staleness)),
            **stats,
            **_mismatch(groups),
            "grad_norm": float(grad_norm),
            "train_tokens_per_s": round(tokens / seconds, 1),
            "train_step_s": round(seconds, 4),
        }

    # --- versions and checkpoints --------------------------------------------------------

    def on_publish(self, version: int) -> Announcement:
        if version != self.step:
            raise RuntimeError(f"asked to publish version {version}, the model is at {self.step}")
        return self.weights.publish(version, state_for_saving(self.model))

    def on_stop(self) -> None:
        if self.step > self.saved_step:
            self.save_checkpoint()
        self.weights.close()

    def save_checkpoint(self) -> Path:
        target = self.run.checkpoint(self.step)
        buffer = io.BytesIO()
        torch.save(
            {
                "step": self.step,
                "optimizer": self.optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(),
            },
            buffer,
        )
        counters = json.dumps({"step": self.step, "policy_version": self.step}).encode()
        save_model(
            self.model,
            self.source,
            target,
            extra={TRAINER_STATE: buffer.getvalue(), "counters.json": counters},
        )
        self.saved_step = self.step
        log.info("checkpoint written", step=self.step, path=str(target))
        return target

    def _save_final(self) -> None:
        save_model(self.model, self.source, self.run.final_model)
        log.info("final model written", step=self.step, path=str(self.run.final_model))

    def _restore(self, checkpoint: Path) -> None:
        load_state(self.model, load_file(str(checkpoint / "model.safetensors")))
        state = torch.load(checkpoint / TRAINER_STATE, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        self.step = self.saved_step = int(state["step"])
        log.info("resumed from a checkpoint", step=self.step, path=str(checkpoint))

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


def _rows(groups: list[_Group], pick, width: int) -> torch.Tensor:
    """One ``[n, longest]`` array per group, stacked into ``[rows, width]`` (zero padded)."""
    arrays = [pick(g) for g in groups]
    out = torch.zeros(sum(a.shape[0] for a in arrays), width)
    row = 0
    for a in arrays:
        out[row : row + a.shape[0], : a.shape[1]] = torch.tensor(a)  # a copy: frames are read-only
        row += a.shape[0]
    return out


def _reference_rows(groups: list[_Group], width: int) -> torch.Tensor | None:
    if any(g.reference is None for g in groups):
        return None  # only the KL penalty reads them, and it is off
    return _rows(groups, lambda g: g.reference.logprobs, width)


def _mismatch(groups: list[_Group]) -> dict:
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
