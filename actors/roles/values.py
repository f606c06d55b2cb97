"""The ``values`` role: the critic's value of every response token, at its version.

Consumes ``transition.*.generated`` (PPO's table, ``Pipeline.with_critic``); produces
:class:`~..payloads.ValuesOut` with the critic version it used, which the scheduler
keeps with the group: the critic's step refuses values older than the staleness bound
allows (they are made again). A branch beside ``logp``: the scorer of the critic.

It follows the critic's versions as a generator follows the policy's: a version the
critic published is loaded between leases from the critic's staged state on this host
(the newest step not past it that every rank of the critic staged, each rank's shard
joined along the first dimension, as the critic's group splits it), checked against the
staged checksums after the copy (the critic may be writing the other slots meanwhile),
and reported loaded.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from asyncrl.runtime.config import RunConfig
from asyncrl.runtime.core.pipeline import Role
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport import protocol as p

from ..actor import Actor, Outcome, WorkerContext
from ..critic import load_value_model, response_values
from ..payloads import RolloutsOut, ValuesOut
from ..training.rank import critic_ranks, staged_identity
from ..training.scorer import pack_rollouts
from ..training.staged_state import StagedState
from ..worker.preflight import check_model
from .critic import critic_path

__all__ = ["Values"]

PARAM = "param/"  # a staged parameter's name prefix (LearnerState.local_state)


class Values(Actor):
    role: ClassVar[str] = Role.VALUES.value
    claim_size: ClassVar[int] = 4
    follows_critic: ClassVar[bool] = True

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return check_model(cfg)

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = ctx.config
        self.model, self.codec = load_value_model(critic_path(cfg))
        self.model.eval()
        directory, ranks = RunDir.of(cfg).critic_staged_state, critic_ranks(cfg)
        identity = staged_identity(cfg, ranks)
        self.stores = [StagedState(directory, rank, identity) for rank in range(ranks)]
        self.loaded = 0  # version 0: the critic as it starts, read from critic.path

    def on_version(self, version: int) -> int | None:
        staged = [store.staged() for store in self.stores]
        usable = [
            s for s in staged[0] if self.loaded < s <= version and all(s in x for x in staged)
        ]
        if not usable:
            return self.loaded
        found = [ranks[max(usable)] for ranks in staged]
        shards = [f.tensors() for f in found]
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(torch.cat([shard[f"{PARAM}{name}"] for shard in shards]))
        for f in found:  # rewritten while copied: try at the next turn
            again = f.slot.verified()
            if again is None or again[0] != f.step or again[3] != f.checksum:
                return self.loaded
        self.loaded = found[0].step
        return self.loaded

    def process(self, lease: p.Lease) -> Outcome:
        results, tokens = [], 0
        for item in lease.items:
            rollouts = RolloutsOut.of(item)
            packed = pack_rollouts([rollouts], self.codec.pad_id)
            with torch.no_grad():
                values = response_values(self.model, packed).float().numpy()
            laid = np.zeros(rollouts.response_ids.shape, np.float32)  # the group's layout
            laid[:, : values.shape[1]] = values
            out = ValuesOut(laid, self.loaded)
            results.append(p.Result(item.gid, out.to_payload()))
            tokens += rollouts.trained_tokens()
        return Outcome(tuple(results), tokens=tokens)

    def on_stop(self) -> None:
        for store in self.stores:
            store.close()
