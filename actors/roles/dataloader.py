"""The ``dataloader`` role: feeds the task's training prompts into ``pending``.

The task is ``data.task``'s plug-in, or the data files of ``data.train_files``, whose
rows it takes in a seeded shuffled order, or a weighted mixture of them
(``data.train_weights``), that depends on the index alone (:mod:`..tasks.order`), so what
follows holds for them too.

Consumes the scheduler's Want (how many groups it can take); produces one
:class:`PromptIn` per group, keyed ``train-{index:09d}``. It keeps no cursor worth saving:
after a restart it offers keys from index 0 again and the scheduler skips the ones it
already holds (its journal records every consumed key), so the data position survives
any crash of either side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p

from ..actor import Actor, WorkerContext
from ..payloads import PromptIn
from ..startup.role_checks import check_task
from ..tasks import Task
from ..workload import load_workload

__all__ = ["Dataloader", "group_key"]


def group_key(index: int) -> str:
    return f"train-{index:09d}"


class Dataloader(Actor):
    role: ClassVar[str] = Role.DATALOADER.value

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return check_task(cfg)

    claim_size: ClassVar[int] = 256  # groups offered per request, at most

    def __init__(self) -> None:
        self.next_index = 0
        self.task: Task | None = None

    def on_start(self, ctx: WorkerContext) -> None:
        self.task = load_workload(ctx.config)

    def feed(self, wanted: int) -> Sequence[p.NewGroup]:
        assert self.task is not None, "on_start loads the task"
        first = self.next_index
        self.next_index += wanted
        groups = []
        for index in range(first, first + wanted):
            sample = self.task.sample("train", index)
            prompt = PromptIn.from_sample(index, sample)
            groups.append(p.NewGroup(group_key(index), prompt.to_payload()))
        return groups
