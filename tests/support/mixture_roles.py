"""The real dataloader (data files, their mixture) feeding the demo pipeline's other roles,
which take a group's number from the dataloader's ``index`` instead of the demo's ``x``
and many groups per lease, so a test can push a thousand prompts through in seconds."""

from __future__ import annotations

from typing import ClassVar

from asyncrl.actors.actor import Actor
from asyncrl.actors.roles.dataloader import Dataloader
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p

from . import demo_pipeline as demo

__all__ = ["ROLES"]


def _index(item: p.Item) -> int:
    return int(item.data[Role.DATALOADER]["index"])


class Generate(demo.Generate):
    claim_size: ClassVar[int] = 64

    def work(self, item: p.Item) -> p.Payload:
        return {"tokens": demo.generate_tokens(_index(item))}


class Logp(demo.Logp):
    claim_size: ClassVar[int] = 64


class RefLogp(demo.RefLogp):
    claim_size: ClassVar[int] = 64


class Reward(demo.Reward):
    claim_size: ClassVar[int] = 64

    def work(self, item: p.Item) -> p.Payload:
        return {"reward": demo.reward_of(_index(item))}


ROLES: dict[str, type[Actor]] = {
    cls.role: cls for cls in (Dataloader, Generate, Logp, RefLogp, Reward, demo.Train)
}
