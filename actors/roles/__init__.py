"""The RL pipeline's roles, by name: what ``pipeline.actors: asyncrl.actors.roles`` runs.

``ROLES[role]`` imports that role's module when it is first asked for, so a worker
imports only its own role: a dataloader or a rule-based reward worker never imports
torch, which only the roles that compute need (about 250 MB a process).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from ..actor import Actor

__all__ = ["ROLES", "RoleTable"]


class RoleTable(Mapping[str, type[Actor]]):
    """Role name -> its worker class, from ``"module:Class"`` paths imported on first use."""

    def __init__(self, paths: Mapping[str, str]) -> None:
        self._paths = dict(paths)
        self._loaded: dict[str, type[Actor]] = {}

    def __getitem__(self, role: str) -> type[Actor]:
        if role not in self._loaded:
            module, _, name = self._paths[role].partition(":")
            self._loaded[role] = getattr(importlib.import_module(module), name)
        return self._loaded[role]

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


ROLES = RoleTable(
    {
        "dataloader": f"{__name__}.dataloader:Dataloader",
        "generate": f"{__name__}.generate:Generate",
        "logp": f"{__name__}.logp:Logp",
        "ref_logp": f"{__name__}.ref_logp:RefLogp",
        "reward": f"{__name__}.reward:Reward",
        "train": f"{__name__}.train:Train",
        "values": f"{__name__}.values:Values",
        "critic": f"{__name__}.critic:Critic",
        "harness": f"{__name__}.harness:Harness",
    }
)
