"""A roles module whose reward worker scores nothing while a gate file is in the run
directory: a test holds a run mid-way for as long as it needs, however fast the machine
trains, instead of racing the run's end (then removes the file and the run goes on).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import ClassVar

from asyncrl.actors.actor import Actor, Outcome, WorkerContext
from asyncrl.actors.roles import ROLES as REAL_ROLES
from asyncrl.actors.roles.reward import Reward
from asyncrl.transport import protocol as p

__all__ = ["GATE", "ROLES"]

GATE = "hold-rewards"  # in the run directory: while it is there, no group is scored


class GatedReward(Reward):
    role: ClassVar[str] = "reward"

    def on_start(self, ctx: WorkerContext) -> None:
        super().on_start(ctx)
        self.gate = Path(ctx.config.run.dir) / GATE

    def process(self, lease: p.Lease) -> Outcome:
        while self.gate.exists():  # the worker's heartbeats go on meanwhile
            time.sleep(0.05)
        return super().process(lease)


ROLES: dict[str, type[Actor]] = {**REAL_ROLES, "reward": GatedReward}
