"""A deterministic busy pipeline driven straight through the core (tests and benchmarks)."""

from __future__ import annotations

import random
from collections.abc import Callable

from asyncrl.runtime.scheduler.core.effects import Grant, Notice, Transition
from asyncrl.runtime.scheduler.core.scheduler import SchedulerCore

WORKERS = {"gen0": "generate", "gen1": "generate", "gen2": "generate", "gen3": "generate",
           "logp0": "logp", "ref0": "ref_logp", "rew0": "reward", "train0": "train"}  # fmt: skip


class Sim:
    """Drives a core like a busy pipeline would; ``commit`` is where records go.

    One dataloader keeps four batches pending, four generators (1% of generations fail and
    are retried), one worker each for logp, ref_logp and reward, and a trainer that
    publishes every version, which the generators load at once.
    """

    def __init__(
        self,
        core: SchedulerCore,
        commit: Callable[[], list[Notice]],
        groups: int,
        durable_every: int = 0,
    ) -> None:
        self.core, self.commit, self.total = core, commit, groups
        # the trainer reports its state durable every this many steps, as a checkpoint
        # would (0: never, and the core keeps every trained group's prompt)
        self.durable_every = durable_every
        self.rng = random.Random(0)
        self.transitions = 0
        self.rounds = 0
        self.now = 0.0

    def count(self) -> None:
        for notice in self.commit():
            if isinstance(notice, Transition):
                self.transitions += len(notice.groups)

    def start(self) -> None:
        for worker, role in WORKERS.items():
            self.core.register(worker, role, self.now)
            if role == "generate":
                self.core.loaded_version(worker, 0)

    def run(self) -> None:
        """Until every full batch of ``groups`` is trained."""
        self.start()
        batch = self.core.settings.train_batch_groups
        idle = 0
        while self.core.state.steps_done * batch < self.total - batch:
            before = self.transitions
            self.step()
            idle = 0 if self.transitions > before else idle + 1
            if idle > 1000:
                raise RuntimeError(f"the simulated pipeline stalled: {self.core.state.counts}")

    def step(self) -> None:
        self.now += 0.01
        self.rounds += 1
        if self.rounds % 100 == 0:  # a heartbeat a second, as real workers send them
            for worker in WORKERS:
                self.core.heartbeat(worker, self.now)
        self.round(self.core.settings.train_batch_groups)
        self.count()

    def round(self, batch: int) -> None:
        core, state = self.core, self.core.state
        if state.next_gid < self.total and state.counts["pending"] < 4 * batch:
            first = state.next_gid
            core.add_groups([f"p{i}" for i in range(first, min(first + 4 * batch, self.total))])
        for worker, role in WORKERS.items():
            grant = core.claim(role, worker, batch, self.now)
            if isinstance(grant, Grant):
                self.finish(worker, role, grant)
        core.tick(self.now)

    def finish(self, worker: str, role: str, grant: Grant) -> None:
        core, gids = self.core, list(grant.groups)
        if role == "generate":
            if self.rng.random() < 0.01:
                core.fail(grant.lease_id, grant.fence, gids[:1], "sampling error")
                gids = gids[1:]
            if gids:
                versions = [(grant.version, core.state.policy_version)] * len(gids)
                core.complete(grant.lease_id, grant.fence, gids, versions)
            return
        durable = None
        if role == "train" and self.durable_every:
            step = core.state.steps_done + 1
            durable = step if step % self.durable_every == 0 else None
        core.complete(grant.lease_id, grant.fence, gids, durable=durable)
        if role == "train":
            core.publish_version(worker, core.state.steps_done)
            for gen in (w for w, r in WORKERS.items() if r == "generate"):
                core.loaded_version(gen, core.state.policy_version)
