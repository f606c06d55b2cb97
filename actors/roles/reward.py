"""The ``reward`` role: scores each response with the task's reward function.

Consumes ``transition.*.generated``; produces :class:`RewardsOut`. Trajectories an
environment or a harness already paid (:attr:`RolloutsOut.rewards`) keep what they were
paid as their task reward. Otherwise the task reward is
``data.reward`` (a plug-in's import path, ``math``, or ``model:DIR`` for a sequence
classifier), or the task's own when that is empty (:mod:`..tasks.rewards`). If it raises,
returns something that is not a finite number, or runs past ``data.reward_timeout_s``,
the lease fails with a reason naming the reward and the problem: that group is tried
again and, after ``pipeline.max_attempts``, reported dead; the run goes on. The math
verifier, a plug-in and a task's own reward run in a child process that is killed when
its call runs past its time (:mod:`..tasks.sandbox`), so no response can hold up the
worker. A reward model's call past its time keeps running on a thread left behind; after
a few such, the worker leaves to be started afresh (nothing else stops a thread).

With ``algorithm.filter_groups`` on, a result also says whether its group carries a
learning signal (:func:`..rl.filtering.filter_reason`); one that does not is moved by the
scheduler to ``filtered`` (``transition.generated.filtered``) and never trained.

With ``algorithm.overlong_buffer`` on, every trajectory's reward is its task reward plus
the soft overlong punishment (:mod:`..tasks.overlong`), paid ones included: the punishment is
about the length of what the model generated, whoever judged its content. The length is
the trajectory's longest turn, its longest run of model tokens (a single-turn response's
whole length), since ``model.max_new_tokens`` limits each turn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.config.recipes import FilterGroupsSection
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p

from ..actor import Actor, ActorBroken, Outcome, WorkerContext
from ..payloads import PromptIn, RewardsOut, RolloutsOut
from ..policy.directories import model_dir
from ..policy.tokenizer import TextCodec
from ..rollout_dump import RolloutDump
from ..startup.role_checks import check_task
from ..tasks import TaskError
from ..tasks.overlong import longest_turns, overlong_penalty
from ..tasks.rewards import MODEL_PREFIX
from ..worker.threads import threads_for
from ..workload import reward_choice, reward_for

__all__ = ["Reward"]

_MAX_STUCK = 3  # reward calls left running past their time before the worker starts afresh


class Reward(Actor):
    role: ClassVar[str] = Role.REWARD.value

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return check_task(cfg)

    claim_size: ClassVar[int] = 1  # a failing reward function fails one group only
    # dynamic sampling (algorithm.filter_groups): off until on_start reads the config
    filter_rule: FilterGroupsSection = FilterGroupsSection()
    filter_reason: Callable[[RewardsOut, FilterGroupsSection], str | None] | None = None

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = ctx.config
        if reward_choice(cfg).startswith(MODEL_PREFIX):
            import torch  # a reward model computes: on this worker's share of the cores

            torch.set_num_threads(threads_for(cfg, self.role))
        self.cfg = cfg
        self.reward = reward_for(cfg)
        self.codec = TextCodec.from_dir(model_dir(cfg.model.path))
        self.dump = RolloutDump.of(cfg, ctx.worker)
        self.filter_rule = cfg.algorithm.filter_groups
        if self.filter_rule.enabled:
            # Here, not at the top: the package's losses import torch, which a reward
            # worker otherwise never loads.
            from ..rl.filtering import filter_reason

            self.filter_reason = filter_reason

    def process(self, lease: p.Lease) -> Outcome:
        tokens = sum(RolloutsOut.of(item).trained_tokens() for item in lease.items)
        return Outcome(tuple(self._score(item) for item in lease.items), tokens=tokens)

    def _score(self, item: p.Item) -> p.Result:
        rollouts = RolloutsOut.of(item)
        task = self._task_rewards(item, rollouts)
        parts = {"task": task}
        a = self.cfg.algorithm
        if a.overlong_buffer:
            lengths = longest_turns(rollouts.trained_mask(), rollouts.owners, len(task))
            budget = self.cfg.model.max_new_tokens
            parts["overlong"] = overlong_penalty(
                lengths, budget, a.overlong_buffer, a.overlong_penalty
            )
        return self._result(item, rollouts, RewardsOut.summed(parts))

    def _task_rewards(self, item: p.Item, rollouts: RolloutsOut) -> np.ndarray:
        if rollouts.rewards is not None:  # an environment or a harness paid them already
            return rollouts.rewards
        sample = PromptIn.of(item).sample()
        try:
            texts = [self.codec.decode(response) for response in rollouts.responses()]
            rewards = self.reward.score_all(sample, texts)
        except TaskError as error:
            if self.reward.stuck >= _MAX_STUCK:
                raise ActorBroken(f"{error}; {self.reward.stuck} reward calls stuck") from error
            raise
        return np.asarray(rewards, np.float32)

    def _result(self, item: p.Item, rollouts: RolloutsOut, rewards: RewardsOut) -> p.Result:
        """The group's rewards, and with dynamic sampling on, whether it is filtered (its
        samples then go to the rollout dump here: the trainer never sees them)."""
        filtered = None
        if self.filter_reason is not None:
            filtered = self.filter_reason(rewards, self.filter_rule)
        if filtered is not None:
            self.dump.filtered(item, rollouts, rewards, filtered)
        return p.Result(item.gid, rewards.to_payload(), filtered=filtered)
