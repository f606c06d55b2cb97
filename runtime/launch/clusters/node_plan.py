"""A run's placement (the config's ``placement``) as the nodes an engine starts: each
node's ``asyncrl node`` roles, its first worker number and its GPUs.

Pure: the engines' renderers (slurm.py) turn these into their own words.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from asyncrl.runtime.contract.config import RunConfig, workers_to_start
from asyncrl.runtime.contract.config.placement import SCHEDULER
from asyncrl.runtime.launch.gpus import gpu_roles
from asyncrl.runtime.launch.plan import GROUPED_ROLES
from asyncrl.transport.security import is_loopback

__all__ = ["NodeShare", "cluster_nodes"]


@dataclass(frozen=True)
class NodeShare:
    """What one node runs: ``asyncrl node --roles ROLES --first-index I``, given GPUS."""

    roles: dict[str, int]
    scheduler: bool
    first_index: int
    gpus: int
    # a group of ranks split over nodes: its first rank on this one (its count in roles)
    first_ranks: dict[str, int] = field(default_factory=dict)

    def roles_arg(self) -> str:
        """``--roles``: ``scheduler,dataloader=1,train=2``, or ``train@2-3`` for ranks 2
        and 3 of a group split over nodes."""
        words = [self._word(role, count) for role, count in self.roles.items()]
        return ",".join([SCHEDULER, *words] if self.scheduler else words)

    def _word(self, role: str, count: int) -> str:
        if role not in self.first_ranks:
            return f"{role}={count}"
        first = self.first_ranks[role]
        return f"{role}@{first}" if count == 1 else f"{role}@{first}-{first + count - 1}"


def cluster_nodes(cfg: RunConfig) -> list[NodeShare]:
    """One share per node, the scheduler's first. ValueError, one line, for a placement
    the run cannot go by: a role of the run that no node runs, a role it has no work
    for, a grouped role whose ranks over its nodes are not ``pipeline.workers``' count.
    A grouped role on several nodes is split by rank, in the order of the nodes."""
    run_roles = workers_to_start(cfg)
    groups = cfg.placement.nodes
    if not groups:  # one node runs it all, as asyncrl run would
        return [_share(cfg, dict(run_roles), True, 0, None)]
    placed: dict[str, int] = {}
    shares: list[NodeShare] = []
    generators = 0  # each node numbers its workers on from the last: generator 0 validates
    for i, group in enumerate(groups):
        roles = {role: n for role, n in group.roles.items() if role != SCHEDULER}
        for role, count in roles.items():
            _check_role(cfg, run_roles, f"placement.nodes[{i}].roles.{role}", role, count,
                        group.count, placed)  # fmt: skip
        for _ in range(group.count):
            share = _share(cfg, roles, SCHEDULER in group.roles, generators, group.gpus)
            shares.append(share)
            generators += roles.get("generate", 0)
        for role, count in roles.items():
            placed[role] = placed.get(role, 0) + count * group.count
    if len(shares) > 1 and is_loopback(cfg.scheduler.host):
        raise ValueError(
            f"scheduler.host: got {cfg.scheduler.host}, loopback, but the placement has "
            f"{len(shares)} nodes; allowed: 0.0.0.0 or an address the other nodes reach"
        )
    missing = [role for role in run_roles if run_roles[role] and role not in placed]
    if missing:
        raise ValueError(
            f"placement.nodes: no node runs {', '.join(missing)}; the run's roles: "
            f"{', '.join(run_roles)} (each must be in some group's roles)"
        )
    for role in GROUPED_ROLES & placed.keys():
        ranks = cfg.pipeline.workers.get(role, 0)
        if placed[role] != ranks:
            raise ValueError(
                f"placement.nodes: {placed[role]} rank(s) of {role} placed over its nodes; "
                f"allowed: {ranks} in all (pipeline.workers.{role})"
            )
    return _split_groups(cfg, shares)


def _split_groups(cfg: RunConfig, shares: list[NodeShare]) -> list[NodeShare]:
    """Each grouped role on several nodes gets its ranks in the order of the nodes."""
    nodes_of = {r: sum(r in s.roles for s in shares) for r in GROUPED_ROLES}
    next_rank = dict.fromkeys(GROUPED_ROLES, 0)
    split: list[NodeShare] = []
    for share in shares:
        first_ranks = {}
        for role, count in share.roles.items():
            if nodes_of.get(role, 0) > 1:
                first_ranks[role] = next_rank[role]
                next_rank[role] += count
        split.append(replace(share, first_ranks=first_ranks))
    return split


def _check_role(cfg: RunConfig, run_roles: dict[str, int], key: str, role: str, count: int,
                nodes: int, placed: dict[str, int]) -> None:  # fmt: skip
    if role not in run_roles:
        raise ValueError(
            f"{key}: {role} has no work in this run; its roles: {', '.join(run_roles)}"
        )
    if role not in GROUPED_ROLES:
        return
    ranks = cfg.pipeline.workers.get(role, 0)
    if placed.get(role, 0) + count * nodes > ranks:
        raise ValueError(
            f"{key}: got {count} on {nodes} node(s), beyond the group's {ranks} rank(s) "
            f"(pipeline.workers.{role}) with {placed.get(role, 0)} placed before"
        )


def _share(cfg: RunConfig, roles: dict[str, int], scheduler: bool, first: int,
           gpus: int | None) -> NodeShare:  # fmt: skip
    if gpus is None:
        wanting = gpu_roles(cfg)
        gpus = sum(count for role, count in roles.items() if role in wanting)
    return NodeShare(roles, scheduler, first, gpus)
