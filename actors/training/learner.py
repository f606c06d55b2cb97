"""The trainer's arithmetic on one rank: a step's loss and update, sharded over a group.

With one rank the model is a plain module. With N ranks (a :class:`~.gang.Gang`) every
decoder layer and the whole model are ``fully_shard``-ed (FSDP2): parameters, gradients
and AdamW state are split N ways, each rank computes its share of a step's micro-batches
(micro-batch m goes to rank m mod N) and the reduce-scatter sums the gradients. The loss
of a micro-batch is already normalised by the whole batch's token and sequence counts,
so the sum over ranks is the one-rank gradient (each rank scales its loss by N to undo
the reduce-scatter's average).

Every rank runs the same number of forward/backward passes (FSDP's all-gathers must pair
up); a rank with fewer micro-batches than the others repeats one with its loss times 0.
With several mini-batches a step is several such updates in a row, each on the same
groups on every rank (the split is a function of the seed and the step), so the pairing
holds per update.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from asyncrl.runtime.contract.config import RunConfig

from ..engines.contract import EngineModel, device_of
from ..policy.model import CausalLM, Entropy
from ..policy.sampling import Sampling
from ..policy.scoring import response_logprobs_and_entropy, response_positions
from ..policy.sharding import full_tensor, shard
from ..rl import (
    CorrectionStats,
    LossConfig,
    LossStats,
    correct,
    correction_metrics,
    loss_metrics,
    merge_correction_stats,
    merge_stats,
    policy_loss,
)
from ..startup.model_loading import DTYPES
from .group import Group
from .host_copies import HostCopies
from .learner_state import LearnerState
from .micro_batches import MICRO_BATCH_SLACK, by_length, rank_passes, stacked
from .mini_batches import mini_batch_groups
from .mismatch import engine_tokens
from .overlong_filter import without_truncated
from .schedule import lr_at
from .scorer import pack_rollouts
from .step_advantages import step_advantages

__all__ = ["MICRO_BATCH_SLACK", "Group", "Learner", "StepStats"]


@dataclass(frozen=True)
class StepStats:
    """One step's numbers, the same on every rank."""

    # loss, the loss statistics (loss_metrics), lr, updates, grad_norm_max
    metrics: dict[str, float]
    grad_norm: float  # the mean over the step's updates
    tokens: int


class Learner(LearnerState):
    """A model and its optimizer on this rank of a group of ``group_size`` (1: alone)."""

    def __init__(
        self, model: CausalLM | EngineModel, cfg: RunConfig, pad_id: int, group_size: int = 1
    ) -> None:
        self.cfg = cfg
        self.pad_id = pad_id
        self.size = group_size
        self.rank = dist.get_rank() if group_size > 1 else 0
        self.model = model
        self.device = device_of(model)  # where the model is: its inputs go there
        # Float32 master weights (load_policy); model.dtype is what forward and backward
        # compute in and what generators and checkpoints receive.
        self.compute_dtype = DTYPES[cfg.model.dtype]
        self._host = HostCopies()  # where a CUDA model's new versions land in CPU memory
        # Another engine splits the model its own way; ours is sharded by FSDP2 here.
        self.engine = model if isinstance(model, EngineModel) else None
        master = next(model.parameters()).dtype
        # megatron's linear layers restore only CUDA's autocast state in their backward
        # (a CPU backward would meet bfloat16 gradients and float32 weights): on CPU it
        # computes in its weights' float32.
        self._autocast_on = self.compute_dtype != master and (
            self.engine is None or self.device.type == "cuda"
        )
        if self.engine is not None:
            # Ranks holding parts of one copy train the same micro-batches.
            self.part, self.parts, self.stats_group = self.engine.data_parallel()
        else:
            self.part, self.parts, self.stats_group = self.rank, group_size, None
            if group_size > 1:
                shard(model, self.device, group_size)
        a = cfg.algorithm
        self.loss_config = LossConfig(
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            offpolicy=a.correction.offpolicy,
            engine=a.correction.engine,
            policy_loss=a.policy_loss,
            kl_coef=a.kl_coef,
            kl_estimator=a.kl_estimator,
            loss_agg=a.loss_agg,
            estimator=a.estimator,
            ratio=a.ratio,
            clip_ratio_c=a.clip_ratio_c,
            entropy_coef=a.entropy_coef,
        )
        # Each token's entropy, from the logits the step scores with: with gradient only
        # under an entropy bonus.
        self.entropy: Entropy = "trained" if a.entropy_coef > 0 else "measured"
        # Router replay: each token through the experts the generator chose for it.
        self.replay = a.router_replay.enabled
        # algorithm.proximal_logp: trainer: the batch comes without logp's log-probs, and
        # the update's own forward pass (before the optimizer step, the step's starting
        # weights) gives them; the corrections it made are gathered here for the metrics.
        self.own_proximal = a.proximal_logp == "trainer"
        self._own_corrections: list[CorrectionStats] = []
        # With LoRA the adapters alone require gradients (lora.py): the optimizer, the
        # clipping and the staged state cover them and not the frozen base.
        self.lora = cfg.model.lora.enabled
        params = (
            [p for p in model.parameters() if p.requires_grad]
            if self.engine is None
            else self.engine.optimized_parameters()
        )
        self.optimizer = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
        optimized = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        # What this rank's optimizer keeps state for (all, unless the engine splits it).
        self.optimized = {n for n, p in model.named_parameters() if id(p) in optimized}

    # --- a step ----------------------------------------------------------------------

    def step(self, groups: list[Group], steps_done: int = 0) -> StepStats:
        """One train step on ``groups`` (every rank passes the same list): the batch's
        advantages, then ``algorithm.mini_batches`` x ``epochs`` optimizer steps, each on
        its mini-batch's groups (:func:`~.mini_batches.mini_batch_groups`) at the rate
        the schedule gives the step after ``steps_done`` steps."""
        a = self.cfg.algorithm
        # Per group and token; each sequence takes its trajectory's (a harness session's
        # several sequences share one). GAE reads the critic's values (the values stage's).
        # Over the whole batch, before it is split: a mini-batch's advantages are the batch's.
        values = None if groups[0].values is None else [g.values.values for g in groups]
        advantages, _ = step_advantages(
            [g.rollouts for g in groups], [g.rewards for g in groups], a, values
        )
        lr = self.set_lr(steps_done)
        # Split first, then leave the truncated rows out of each mini-batch: the split is
        # the same with the overlong filter on or off, and a group whose every response
        # was cut off cannot make the groups uneven between mini-batches.
        split = mini_batch_groups(
            len(groups), a.mini_batches, a.epochs, seed=self.cfg.run.seed, step=steps_done
        )
        losses, parts, norms = [], [], []
        corrections: list[CorrectionStats] = []
        kept_rows = tokens = 0  # counted over the first epoch, which takes every group once
        for update, chosen in enumerate(split):
            picked = self._without_truncated(
                [groups[i] for i in chosen], [advantages[i] for i in chosen]
            )
            if update < a.mini_batches:
                kept_rows += sum(len(g.rollouts.lengths) for g in picked[0])
                tokens += sum(g.rollouts.trained_tokens() for g in picked[0])
            if not picked[0]:  # every response of the mini-batch was cut off
                continue
            corrected = self._corrected(picked[0])
            if update < a.mini_batches and not self.own_proximal:
                corrections.append(corrected)
            totals = (int(corrected.kept_tokens), int(corrected.kept_sequences))
            if not totals[0]:  # the corrections took out every token of the mini-batch
                continue
            loss, stats, grad_norm = self._update(*picked, totals)
            if self.own_proximal:
                corrections.append(self._take_own_corrections())
            losses.append(loss)
            parts.append(stats)
            norms.append(grad_norm)
        filtered = {}
        if a.overlong_filter:  # the share of the step's rows the filter took out
            rows = sum(len(g.rollouts.lengths) for g in groups)
            filtered["overlong_filtered_frac"] = 1.0 - kept_rows / rows
        if corrections:
            filtered.update(correction_metrics(corrections))
        if not losses:  # every response was cut off or rejected: nothing to learn from
            return StepStats({"loss": 0.0, "lr": lr, "updates": 0, **filtered}, 0.0, 0)
        # The updates' loss statistics pooled over their tokens; the loss (each update's
        # normalised over its mini-batch) and the gradient norms averaged over the updates.
        metrics = {
            "loss": float(np.mean(losses)),
            **loss_metrics(parts),
            "lr": lr,
            "updates": len(losses),
            "grad_norm_max": max(norms),
            **filtered,
        }
        return StepStats(metrics, float(np.mean(norms)), tokens)

    def set_lr(self, steps_done: int) -> float:
        """Set the optimizer's rate for the step after ``steps_done``, and return it."""
        lr = self._scheduled_lr(steps_done)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def _scheduled_lr(self, steps_done: int) -> float:
        a = self.cfg.algorithm
        return lr_at(steps_done, a.lr, a.lr_schedule, self.cfg.run.total_steps)

    def _update(
        self, groups: list[Group], advantages: list[np.ndarray], totals: tuple[int, int]
    ) -> tuple[float, LossStats, float]:
        """One optimizer step on a mini-batch: its loss normalised over its own ``totals``
        (tokens and sequences in the loss), its gradient clipped by itself. Its loss,
        stats and grad norm."""
        loss, stats = self._accumulate(groups, advantages, totals)
        max_norm = self.cfg.algorithm.max_grad_norm
        if self.engine is not None:
            self.engine.finish_gradients()
            grad_norm = self.engine.clip_grad_norm(max_norm)
        else:
            trained = [p for p in self.model.parameters() if p.requires_grad]
            grad_norm = torch.nn.utils.clip_grad_norm_(trained, max_norm)
        self.optimizer.step()
        if self.engine is not None:
            self.engine.finish_step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, stats, float(full_tensor(grad_norm))

    def skip(self, groups: list[Group], steps_done: int = 0) -> StepStats:
        """A step that takes its batch without an update: the policy waits while the
        critic warms up (``critic.warmup_steps``). The schedule counts it all the same."""
        tokens = sum(g.rollouts.trained_tokens() for g in groups)
        lr = self._scheduled_lr(steps_done)
        return StepStats({"warmup": 1.0, "lr": lr, "updates": 0}, 0.0, tokens)

    def _without_truncated(
        self, groups: list[Group], advantages: list[np.ndarray]
    ) -> tuple[list[Group], list[np.ndarray]]:
        """A mini-batch without the truncated trajectories under ``algorithm.overlong_filter``
        (overlong_filter.py): they give no loss and count in none of its totals."""
        if not self.cfg.algorithm.overlong_filter:
            return groups, advantages
        return without_truncated(groups, advantages)

    def _corrected(self, groups: list[Group]) -> CorrectionStats:
        """What the corrections do to a mini-batch's rows (correction.py), from the
        proximal and behaviour log-probs and versions alone, so known before its first
        micro-batch: its kept tokens and rows are the loss's normalisers (a rejected
        sequence or masked token is in neither, as a truncated one under the overlong
        filter). The same on every rank, which sees the same groups.

        Without logp's log-probs (the trainer's own, ``algorithm.proximal_logp: trainer``)
        the behaviour's stand in: with no rejection, which that setting asks for, the
        kept tokens and rows are the trained ones whatever the weights."""
        c = self.loss_config
        stats = []
        for g in groups:
            r = g.rollouts
            proximal = r.logprobs if g.proximal is None else g.proximal.logprobs
            stats.append(
                correct(
                    torch.from_numpy(np.asarray(proximal, np.float32)),
                    torch.from_numpy(np.asarray(r.logprobs, np.float32)),
                    torch.from_numpy(engine_tokens(g)),
                    torch.from_numpy(r.trained_mask()),
                    c.offpolicy,
                    c.engine,
                ).stats
            )
        return merge_correction_stats(stats)

    def _accumulate(
        self, groups: list[Group], advantages: list[np.ndarray], totals: tuple[int, int]
    ) -> tuple[float, LossStats]:
        self.model.train()
        passes = self._passes(groups, advantages)
        if self.engine is not None and self.engine.pipelined:
            loss, parts = self._accumulate_in_stages(passes, totals)
            return self._summed(loss, parts)
        parts: list[LossStats] = []
        total_loss = torch.zeros((), device=self.device)
        for chunk, chunk_advantages, real in passes:
            packed = pack_rollouts([g.rollouts for g in chunk], self.pad_id, self.replay)
            with self._autocast():
                logp, entropy = self._logprobs(packed)
            if real and self.own_proximal:
                self._own_corrections.append(self._own_correction(chunk, logp, packed))
            loss, part = self._loss(chunk, chunk_advantages, logp, packed, totals, entropy)
            if not real:
                loss = loss * 0.0  # a pass only to pair up the group's collectives
            # FSDP's reduce-scatter averages over ranks (gloo has no pre-scaled sum); the
            # loss is normalised over the whole batch already, so undo the average. Another
            # engine sums its copies' gradients itself (finish_gradients).
            fsdp = self.size > 1 and self.engine is None
            (loss * self.size if fsdp else loss).backward()
            if real:
                parts.append(part)
                total_loss += loss.detach()
        return self._summed(total_loss, parts)

    def _logprobs(self, packed) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch's log-probs, and the entropies of their distributions, from the
        same pass."""
        sampling = Sampling.of(self.cfg.algorithm)
        return response_logprobs_and_entropy(self.model, packed, sampling, self.entropy)

    def _passes(self, groups: list[Group], advantages: list[np.ndarray]):
        """This rank's micro-batches: (row sets of groups, their advantages, real). The
        step's rows are sorted by length and cut into micro-batches of like length
        (by_length), no bigger than ``micro_batch_groups`` groups of the longest (the
        loss is normalised over the whole step, so how rows are split does not change
        it). Micro-batch m goes to copy m mod copies; every rank makes as many passes as
        the busiest, a pass beyond its own share repeating the last (shortest)
        micro-batch and not real (its loss counts 0)."""
        batches = by_length(groups, advantages, self.cfg.algorithm.micro_batch_groups)
        return rank_passes(batches, self.part, self.parts)

    def _accumulate_in_stages(self, passes, totals: tuple[int, int]):
        """The passes through the engine's pipeline stages, which overlap on different
        micro-batches (1F1B); the loss and its statistics exist on the last stage."""
        assert self.engine is not None
        packed = [
            pack_rollouts([g.rollouts for g in chunk], self.pad_id, self.replay)
            for chunk, _, _ in passes
        ]
        parts: list[LossStats] = []
        total_loss = torch.zeros((), device=self.device)

        def loss_of(m: int, picked: torch.Tensor, entropy: torch.Tensor | None) -> torch.Tensor:
            chunk, chunk_advantages, real = passes[m]
            logp = picked * packed[m].mask.to(self.device)
            loss, part = self._loss(chunk, chunk_advantages, logp, packed[m], totals, entropy)
            if not real:
                return loss * 0.0
            parts.append(part)
            total_loss.add_(loss.detach())
            return loss

        batches = [response_positions(one, self.device) for one in packed]
        sampling = Sampling.of(self.cfg.algorithm)
        self.engine.train_in_stages(batches, loss_of, sampling, self._autocast, self.entropy)
        return total_loss, parts

    def _own_correction(self, groups: list[Group], logp: torch.Tensor, packed) -> CorrectionStats:
        """What the corrections did to a micro-batch's rows, whose proximal log-probs are
        the forward pass's ``logp`` (``algorithm.proximal_logp: trainer``)."""
        # On the forward's device: no copy of its log-probs to the host per micro-batch.
        width, d = packed.mask.shape[1], logp.device
        c = self.loss_config
        return correct(
            logp.detach(),
            _rows(groups, lambda g: g.rollouts.logprobs, width).to(d),
            (_rows(groups, engine_tokens, width) > 0.5).to(d),
            packed.mask.to(d),
            c.offpolicy,
            c.engine,
        ).stats

    def _take_own_corrections(self) -> CorrectionStats:
        """The update's corrections over every rank's micro-batches (sums added, maxima
        the largest), and a clean list for the next update."""
        taken, self._own_corrections = self._own_corrections, []
        names = [f.name for f in fields(CorrectionStats)]
        if taken:
            merged = merge_correction_stats(taken)
        else:  # a rank with no micro-batch of its own: neutral
            merged = CorrectionStats(**{n: torch.zeros((), device=self.device) for n in names})
        if self.parts == 1:
            return merged
        maxima = [n for n in names if n.endswith("_max")]
        sums = [n for n in names if n not in maxima]
        reduced = {}
        for chosen, op in ((sums, dist.ReduceOp.SUM), (maxima, dist.ReduceOp.MAX)):
            values = torch.stack([getattr(merged, n).float() for n in chosen]).to(self.device)
            dist.all_reduce(values, op=op, group=self.stats_group)
            reduced.update(zip(chosen, values, strict=True))
        return CorrectionStats(**reduced)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=self._autocast_on)

    def _summed(self, loss: torch.Tensor, parts: list[LossStats]):
        """The step's loss and stats over every rank's micro-batches."""
        in_stages = self.engine is not None and self.engine.pipelined
        if self.parts == 1 and not in_stages:  # one copy: its ranks saw the same batches
            return float(loss), merge_stats(parts)
        merged = merge_stats(parts) if parts else None
        # Every rank measures the same optional stats (the same config), even a rank
        # with no micro-batch of its own, so that the sums line up.
        measured = {"kl_sum": self.loss_config.kl_coef > 0, "entropy_sum": True}
        names = [f.name for f in fields(LossStats) if measured.get(f.name, True)]
        sums = torch.stack([loss.float()] + [_value(merged, name, self.device) for name in names])
        if in_stages:  # computed on the last stage only
            assert self.engine is not None
            self.engine.from_last_stage(sums)
        if self.parts > 1:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=self.stats_group)
        values = iter(sums.tolist())
        total_loss = next(values)
        out: dict[str, Any] = dict.fromkeys(measured)  # None unless measured
        for name in names:
            out[name] = torch.tensor(next(values), device=self.device)
        return total_loss, LossStats(**out)

    def _loss(
        self,
        groups,
        advantages,
        logp: torch.Tensor,
        packed,
        totals: tuple[int, int],
        entropy: torch.Tensor | None = None,
    ):
        """The policy loss of one micro-batch from its log-probs (and the entropies of the
        distributions they are of, when measured), and its statistics."""
        width = packed.mask.shape[1]
        d = self.device
        reference = _reference_rows(groups, width)
        total_tokens, total_sequences = totals
        proximal = (
            logp.detach()  # algorithm.proximal_logp: trainer: the update's own weights
            if self.own_proximal
            else _rows(groups, lambda g: g.proximal.logprobs, width).to(d)
        )
        return policy_loss(
            logp,
            proximal,
            _rows(groups, lambda g: g.rollouts.logprobs, width).to(d),
            stacked(advantages, width).to(d),
            packed.mask.to(d),
            self.loss_config,
            ref_logp=None if reference is None else reference.to(d),
            entropy=entropy,
            total_tokens=total_tokens,
            total_sequences=total_sequences,
            max_len=self.cfg.model.max_new_tokens,
            engine_tokens=_rows(groups, engine_tokens, width).to(d) > 0.5,
        )


def _value(stats: LossStats | None, name: str, device: torch.device) -> torch.Tensor:
    value = None if stats is None else getattr(stats, name)
    return torch.zeros((), device=device) if value is None else value.detach().float().reshape(())


def _rows(groups: list[Group], pick, width: int) -> torch.Tensor:
    """One ``[n, longest]`` array per group, stacked into ``[rows, width]`` (zero padded)."""
    return stacked([pick(g) for g in groups], width)


def _reference_rows(groups: list[Group], width: int) -> torch.Tensor | None:
    if any(g.reference is None for g in groups):
        return None  # only the KL penalty reads them, and it is off
    return _rows(groups, lambda g: g.reference.logprobs, width)
