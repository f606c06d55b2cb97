"""Whether a worker's results fit its lease: pure checks, each naming what is wrong."""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.runtime.contract.refusals import Reason
from asyncrl.runtime.contract.stages import Gate, Stage

from .entities import Lease

__all__ = ["Problem", "completion_problem", "membership_problem"]

Problem = tuple[Reason, str]


def membership_problem(lease: Lease, gids: Sequence[int]) -> Problem | None:
    if not gids or len(set(gids)) != len(gids):
        return Reason.BAD_REQUEST, "name each group of the lease once"
    outside = [g for g in gids if g not in lease.gids]
    if outside:
        return Reason.NOT_IN_LEASE, f"groups {outside[:5]} are not in lease {lease.lid}"
    return None


def completion_problem(
    stage: Stage,
    lease: Lease,
    gids: Sequence[int],
    behaviour: Sequence[Sequence[int]] | None,
    policy_version: int,
) -> Problem | None:
    problem = membership_problem(lease, gids)
    if problem is not None:
        return problem
    if stage.gate.batched and set(gids) != lease.gids:
        return Reason.INCOMPLETE_STEP, f"a {stage.role} step completes its whole batch"
    if (behaviour is not None) != (stage.gate is Gate.ADMIT):
        want = "needs" if stage.gate is Gate.ADMIT else "takes no"
        return Reason.BAD_RESULT, f"a {stage.role} completion {want} behaviour versions"
    if behaviour is None:
        return None
    return versions_problem(lease, gids, behaviour, policy_version)


def versions_problem(
    lease: Lease, gids: Sequence[int], behaviour: Sequence[Sequence[int]], policy_version: int
) -> Problem | None:
    """Each group's (min, max) token versions lie in [loaded at claim, published]."""
    if len(behaviour) != len(gids):
        return Reason.BAD_RESULT, f"{len(behaviour)} version pairs for {len(gids)} groups"
    low = lease.version
    for gid, pair in zip(gids, behaviour, strict=True):
        if len(pair) != 2 or not low <= pair[0] <= pair[1] <= policy_version:
            detail = f"group {gid}: versions {list(pair)} outside [{low}, {policy_version}]"
            return Reason.BAD_VERSION, detail
    return None
