"""What the trainer and the critic read of one leased group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p

from ..payloads import LogprobsOut, RewardsOut, RolloutsOut, ValuesOut

__all__ = ["Group"]


@dataclass(frozen=True)
class Group:
    """What the trainer reads of one leased group."""

    gid: int
    rollouts: RolloutsOut
    proximal: LogprobsOut | None  # None: a lease that carries no logp (the critic's)
    reference: LogprobsOut | None  # None: no ref_logp stage ran (algorithm.kl_coef is 0)
    rewards: np.ndarray
    values: ValuesOut | None = None  # the critic's (values stage or step); None: none yet
    reward_parts: Mapping[str, np.ndarray] | None = None  # RewardsOut.parts; None: unread

    @classmethod
    def of(cls, item: p.Item, *, routes: bool = False) -> Group:
        """``routes``: the group must carry the generator's routes (router replay)."""
        rewards = RewardsOut.of(item)
        return cls(
            gid=item.gid,
            rollouts=RolloutsOut.of(item, routes=routes),
            proximal=LogprobsOut.of(item, Role.LOGP) if Role.LOGP in item.data else None,
            reference=LogprobsOut.of(item, Role.REF_LOGP) if Role.REF_LOGP in item.data else None,
            rewards=rewards.rewards,
            values=ValuesOut.made_for(item),
            reward_parts=rewards.parts,
        )

    def rows(self, chosen: np.ndarray) -> Group:
        """This group's rows ``chosen`` alone, every array cut to the longest of them."""
        r = self.rollouts
        width = max(1, int(r.lengths[chosen].max()))

        def cut(a: np.ndarray) -> np.ndarray:
            return a[chosen, :width]

        rollouts = replace(
            r,
            response_ids=cut(r.response_ids),
            lengths=r.lengths[chosen],
            logprobs=cut(r.logprobs),
            versions=cut(r.versions),
            truncated=r.truncated[chosen],
            loss_mask=cut(r.loss_mask),
            owners=r.owners[chosen],
            routes=None if r.routes is None else cut(r.routes),
            prompt_routes=(
                r.prompt_routes
                if r.prompt_routes is None or r.prompt_routes.ndim == 3
                else r.prompt_routes[chosen]
            ),
        )
        proximal = self.proximal
        if proximal is not None:
            proximal = replace(proximal, logprobs=cut(proximal.logprobs))
        reference = self.reference
        if reference is not None:
            reference = replace(reference, logprobs=cut(reference.logprobs))
        values = self.values
        if values is not None:
            values = ValuesOut(cut(values.values), values.version)
        return replace(
            self, rollouts=rollouts, proximal=proximal, reference=reference, values=values
        )
