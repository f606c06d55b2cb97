"""The ``reward`` role: scores each response with the task's reward function.

Consumes ``transition.*.generated``; produces :class:`RewardsOut`. The reward function
is a plug-in: ``data.reward`` (an import path), or the task's own when that is empty. If
it raises, or returns something that is not a finite number, the lease fails with a
reason naming the plug-in and the problem: that group is tried again and, after
``pipeline.max_attempts``, reported dead; the run goes on.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from asyncrl.runtime.config import RunConfig
from asyncrl.runtime.core.pipeline import Role
from asyncrl.transport import protocol as p

from ._scorer import tokens_of
from .actor import Actor, Outcome, WorkerContext
from .payloads import PromptIn, RewardsOut, RolloutsOut
from .policy.checkpoint import model_dir
from .policy.tokenizer import TextCodec
from .preflight import check_task
from .tasks import RewardFunction, Sample, load_task

__all__ = ["Reward"]


class Reward(Actor):
    role: ClassVar[str] = Role.REWARD.value

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return check_task(cfg)

    claim_size: ClassVar[int] = 1  # a failing reward function fails one group only

    def on_start(self, ctx: WorkerContext) -> None:
        data = ctx.config.data
        self.reward = RewardFunction.load(data.reward, load_task(data.task), data.task)
        self.codec = TextCodec.from_dir(model_dir(ctx.config.model.path))

    def process(self, lease: p.Lease) -> Outcome:
        return Outcome(tuple(self._score(item) for item in lease.items), tokens=tokens_of(lease))

    def _score(self, item: p.Item) -> p.Result:
        prompt = PromptIn.of(item)
        sample = Sample(prompt.prompt, prompt.answer)
        rewards = [
            self.reward(sample, self.codec.decode(response))
            for response in RolloutsOut.of(item).responses()
        ]
        return p.Result(item.gid, RewardsOut(np.asarray(rewards, np.float32)).to_payload())
