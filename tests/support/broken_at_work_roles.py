"""A roles module whose reward worker starts well and breaks at its first lease, on every
start (for the crash-loop test of a worker that comes up: a training group whose first
update breaks behaves so)."""

from __future__ import annotations

from typing import ClassVar

from asyncrl.actors.actor import Actor, ActorBroken, Outcome
from asyncrl.actors.roles import ROLES as REAL_ROLES
from asyncrl.transport import protocol as p

__all__ = ["ROLES"]


class RewardThatBreaksAtWork(Actor):
    role: ClassVar[str] = "reward"

    def process(self, lease: p.Lease) -> Outcome:
        raise ActorBroken("the reward model's answers no longer parse")


ROLES: dict[str, type[Actor]] = {**REAL_ROLES, "reward": RewardThatBreaksAtWork}
