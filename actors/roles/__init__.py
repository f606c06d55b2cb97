"""The RL pipeline's roles, by name: what ``pipeline.actors: asyncrl.actors.roles`` runs."""

from __future__ import annotations

from ..actor import Actor
from .dataloader import Dataloader
from .generate import Generate
from .harness import Harness
from .logp import Logp
from .ref_logp import RefLogp
from .reward import Reward
from .train import Train

__all__ = ["ROLES"]

ROLES: dict[str, type[Actor]] = {
    cls.role: cls for cls in (Dataloader, Generate, Logp, RefLogp, Reward, Train, Harness)
}
