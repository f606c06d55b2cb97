"""A roles module whose trainer announces every version at a weight-plane address that
never answers (a UCX worker that serves nothing): a planted transport failure, for the
test that a weight plane that cannot deliver says so and stops the run.

Run with ``weights.map_on_host=false``, so that generators on the trainer's host fetch
over UCX instead of mapping its staged files.
"""

from __future__ import annotations

from typing import ClassVar

from asyncrl.actors.actor import Actor, WorkerContext
from asyncrl.actors.roles import ROLES as REAL_ROLES
from asyncrl.actors.roles.train import Train
from asyncrl.transport.weights.base import Announcement
from asyncrl.transport.weights.ucx.node import UcxNode

__all__ = ["ROLES"]


class TrainWithASilentSource(Train):
    role: ClassVar[str] = "train"

    def on_start(self, ctx: WorkerContext) -> None:
        super().on_start(ctx)
        self.silent = UcxNode()

    def on_publish(self, version: int) -> Announcement:
        real = super().on_publish(version)
        return Announcement(real.version, real.manifest, self.silent.address)


ROLES: dict[str, type[Actor]] = {**REAL_ROLES, "train": TrainWithASilentSource}
