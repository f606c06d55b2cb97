"""The critic's update on one rank: a step of the clipped value loss over a batch.

A step takes as many optimizer steps as the policy's (``algorithm.mini_batches`` x
``epochs``, the batch's groups split the same way), each normalised over its mini-batch;
its rate follows ``critic.lr_schedule`` over the critic's own step count.

The targets are GAE's returns (``R_t = A_t + V_t``) computed from the batch's rewards and
its values (the *old* values, which also anchor the clip): the ``values`` stage's, or,
without one, the critic's own as it stands, read off the update's forward pass.
Micro-batches and their split over a group of ranks are the trainer's
(:mod:`..training.micro_batches`); the state's ins and outs (staging, checkpoints,
publishing) are :class:`~..training.learner_state.LearnerState`'s, as for the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist

from asyncrl.runtime.contract.config import RunConfig

from ..payloads import ValuesOut
from ..policy.sharding import full_tensor, shard, state_dicts
from ..rl import value_loss
from ..training.group import Group
from ..training.host_copies import HostCopies
from ..training.learner_state import LearnerState
from ..training.micro_batches import by_length, rank_passes, stacked
from ..training.mini_batches import mini_batch_groups
from ..training.schedule import lr_at
from ..training.scorer import by_like_length, pack_rollouts, per_group
from ..training.step_advantages import step_advantages
from .model import ValueModel, freeze_lower_layers, load_value_weights, response_values

__all__ = ["CriticLearner", "CriticStats"]


@dataclass(frozen=True)
class CriticStats:
    """One critic step's numbers, the same on every rank."""

    value_loss: float
    value_clip_frac: float  # model tokens whose clipped error was the larger
    grad_norm: float  # the mean over the step's updates
    tokens: int
    lr: float = 0.0  # the rate of the step's updates (critic.lr_schedule)
    updates: int = 1  # optimizer steps taken (algorithm.mini_batches x epochs)
    grad_norm_max: float = 0.0
    # each group's values when the step made them (no values stage), in the batch's order
    made: tuple[np.ndarray, ...] | None = None


class CriticLearner(LearnerState):
    """The value model and its optimizer on this rank of a group of ``group_size``."""

    def __init__(
        self,
        model: ValueModel,
        cfg: RunConfig,
        pad_id: int,
        *,
        lr: float,
        clip: float,
        group_size: int = 1,
    ) -> None:
        self.cfg, self.pad_id, self.clip = cfg, pad_id, clip
        self.base_lr = lr  # the rate critic.lr_schedule scales
        self.size = group_size
        self.rank = dist.get_rank() if group_size > 1 else 0
        self.model = model
        self.engine = None  # the critic runs on the torch engine
        self.lora = False  # it trains its whole model, whatever model.lora says
        self.device = next(model.parameters()).device
        self.compute_dtype = next(model.parameters()).dtype
        self._host = HostCopies()
        freeze_lower_layers(model, cfg.critic.frozen_layers)
        if group_size > 1:
            shard(model, self.device, group_size)
        trained = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
        # What staging copies and resuming restores; frozen layers come from critic.path.
        self.optimized = {name for name, p in model.named_parameters() if p.requires_grad}

    def step(self, groups: list[Group], steps_done: int = 0) -> CriticStats:
        """One critic step towards the batch's returns (every rank the same list): as the
        policy's, ``algorithm.mini_batches`` x ``epochs`` optimizer steps over the same
        split, at the rate ``critic.lr_schedule`` gives the step after ``steps_done``.

        Groups without values (no values stage ran: ``critic.values: step``) get them from
        this critic as it stands, version ``steps_done``, returned in ``CriticStats.made``:
        from the update's own forward pass when the step is one update on one rank, else
        from a forward pass before the first update (the later updates must be measured
        against the values the advantages are estimated with, not moved ones).
        """
        missing = [g.values is None for g in groups]
        if any(missing) and not all(missing):
            raise ValueError("a critic step's groups either all bring values or none does")
        a = self.cfg.algorithm
        c = self.cfg.critic
        lr = lr_at(steps_done, self.base_lr, c.lr_schedule, self.cfg.run.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        split = mini_batch_groups(
            len(groups), a.mini_batches, a.epochs, seed=self.cfg.run.seed, step=steps_done
        )
        made: list[np.ndarray] | None = None
        if all(missing) and len(split) == 1 and self.size == 1:
            loss, clipped, seen, grad_norm, made = self._update_making_values(groups)
            losses, norms, clipped_tokens, seen_tokens = [loss], [grad_norm], clipped, seen
        else:
            if all(missing):
                made = self.values_of(groups)
                groups = [
                    replace(g, values=ValuesOut(v, steps_done))
                    for g, v in zip(groups, made, strict=True)
                ]
            returns = self._returns(groups, [g.values.values for g in groups])  # type: ignore[union-attr]
            losses, norms, clipped_tokens, seen_tokens = [], [], 0.0, 0
            for chosen in split:
                loss, clipped, tokens, grad_norm = self._update(
                    [groups[i] for i in chosen], [returns[i] for i in chosen]
                )
                losses.append(loss)
                norms.append(grad_norm)
                clipped_tokens += clipped
                seen_tokens += tokens
        tokens = sum(g.rollouts.trained_tokens() for g in groups)
        return CriticStats(
            float(np.mean(losses)),
            clipped_tokens / max(seen_tokens, 1),
            float(np.mean(norms)),
            tokens,
            lr=lr,
            updates=len(split),
            grad_norm_max=max(norms),
            made=None if made is None else tuple(made),
        )

    def _returns(self, groups: list[Group], values: list[np.ndarray]) -> list[np.ndarray]:
        """GAE's returns (``R_t = A_t + V_t``), the critic's targets, from each group's
        rewards and ``values``; per row, so a micro-batch's rows alone give theirs."""
        _, returns = step_advantages(
            [g.rollouts for g in groups],
            [g.rewards for g in groups],
            replace(self.cfg.algorithm, estimator="gae"),  # its targets are GAE's returns
            values,
        )
        assert returns is not None
        return returns

    def values_of(self, groups: list[Group]) -> list[np.ndarray]:
        """Each group's ``[rows, longest]`` values under the critic as it stands, as the
        values stage makes them (every rank scores every group: a group's shards meet in
        each forward pass, and every rank needs them all)."""
        self.model.eval()
        rollouts = [g.rollouts for g in groups]
        packed = pack_rollouts(rollouts, self.pad_id)
        # no_grad, not inference_mode: FSDP2 keeps the parameters it gathers in a forward,
        # and inference tensors there break the update's in-place steps after it.
        with torch.no_grad():
            values = by_like_length(packed, lambda part: response_values(self.model, part))
        return per_group(values, rollouts)

    def _update(self, groups: list[Group], returns: list[np.ndarray]):
        """One optimizer step on a mini-batch, its loss normalised over its own tokens:
        the loss, clipped tokens, tokens and grad norm."""
        self.model.train()
        tokens = sum(g.rollouts.trained_tokens() for g in groups)
        batches = by_length(groups, returns, self.cfg.algorithm.micro_batch_groups)
        sums = torch.zeros(2, device=self.device)  # loss, clipped tokens
        for chunk, chunk_returns, real in rank_passes(batches, self.rank, self.size):
            packed = pack_rollouts([g.rollouts for g in chunk], self.pad_id)
            width = packed.mask.shape[1]
            old = stacked([g.values.values for g in chunk], width)
            loss, clipped = value_loss(
                response_values(self.model, packed),
                old.to(self.device),
                stacked(chunk_returns, width).to(self.device),
                packed.mask.to(self.device),
                clip=self.clip,
                total_tokens=float(tokens),
            )
            if not real:
                loss = loss * 0.0  # a pass only to pair up the group's collectives
            # FSDP averages gradients over ranks; the loss is normalised over the step.
            (loss * self.size).backward()
            if real:
                sums += torch.stack([loss.detach(), clipped.to(sums.dtype)])
        return self._optimizer_step(sums, tokens)

    def _update_making_values(self, groups: list[Group]):
        """The step's one update (one rank) with the values read off its own forward pass:
        each micro-batch's values, before any change, give its rows' returns (GAE is per
        row), the loss's targets. The clip's anchor is those values themselves, so the
        clip does nothing: it bounds later updates against the first one's values, and
        there are none. The loss, clipped tokens, tokens, grad norm and each group's values.
        """
        self.model.train()
        tokens = sum(g.rollouts.trained_tokens() for g in groups)
        # by_length splits groups by rows: each micro-batch's parts carry their row numbers
        # in place of advantages, to lay their values back into their whole groups.
        numbers = [_row_numbers(g) for g in groups]
        made = [np.zeros(g.rollouts.response_ids.shape, np.float32) for g in groups]
        where = {g.gid: i for i, g in enumerate(groups)}
        sums = torch.zeros(2, device=self.device)
        for chunk, rows in by_length(groups, numbers, self.cfg.algorithm.micro_batch_groups):
            rollouts = [g.rollouts for g in chunk]
            packed = pack_rollouts(rollouts, self.pad_id)
            width = packed.mask.shape[1]
            values = response_values(self.model, packed)
            laid = per_group(values.detach().float().cpu().numpy(), rollouts)
            returns = self._returns(chunk, laid)
            loss, clipped = value_loss(
                values,
                values.detach(),
                stacked(returns, width).to(self.device),
                packed.mask.to(self.device),
                clip=self.clip,
                total_tokens=float(tokens),
            )
            loss.backward()
            sums += torch.stack([loss.detach(), clipped.to(sums.dtype)])
            for part, row_numbers, part_values in zip(chunk, rows, laid, strict=True):
                whole = made[where[part.gid]]
                whole[row_numbers[:, 0], : part_values.shape[1]] = part_values
        return (*self._optimizer_step(sums, tokens), made)

    def _optimizer_step(self, sums: torch.Tensor, tokens: int) -> tuple[float, float, int, float]:
        """The accumulated gradients applied: the loss, clipped tokens, tokens, grad norm."""
        if self.size > 1:
            dist.all_reduce(sums)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.cfg.algorithm.max_grad_norm
        )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss, clipped = sums.tolist()
        return loss, clipped, tokens, float(full_tensor(grad_norm))

    def load_full_weights(self, whole: dict[str, torch.Tensor] | None) -> None:
        """A critic checkpoint's weights (``model.*``, ``score.*``: no output layer to tie);
        with a group rank 0 passes them and the others None, each keeping its shard."""
        if self.size == 1:
            assert whole is not None
            extra = sorted(set(whole) - {name for name, _ in self.model.named_parameters()})
            if extra:
                # Loading only what fits would resume another critic than the one saved.
                raise ValueError(
                    f"the critic's checkpoint has weights this critic lacks, {extra[:3]}: "
                    f"it was written with more decoder layers than critic.layers="
                    f"{self.cfg.critic.layers} keeps; resume with the run's own value"
                )
            load_value_weights(self.model, whole, source="the critic's checkpoint")
            return
        dcp = state_dicts()
        options = dcp.StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        dcp.set_model_state_dict(self.model, whole or {}, options=options)


def _row_numbers(group: Group) -> np.ndarray:
    """``[rows, longest]``: each row of ``group`` filled with its own number."""
    rows, width = group.rollouts.response_ids.shape
    return np.repeat(np.arange(rows)[:, None], max(width, 1), axis=1)
