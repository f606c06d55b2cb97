"""A roles module whose reward worker fails at every start (for the crash-loop test).

It passes every check made before processes start, like a real plug-in whose service is
down: only starting it shows the problem.
"""

from __future__ import annotations

from typing import ClassVar

from asyncrl.actors.actor import Actor, WorkerContext
from asyncrl.actors.roles import ROLES as REAL_ROLES

__all__ = ["ROLES"]


class RewardThatCannotStart(Actor):
    role: ClassVar[str] = "reward"

    def on_start(self, ctx: WorkerContext) -> None:
        raise ConnectionRefusedError("the reward model's server at 127.0.0.1:9 refused")


ROLES: dict[str, type[Actor]] = {**REAL_ROLES, "reward": RewardThatCannotStart}
