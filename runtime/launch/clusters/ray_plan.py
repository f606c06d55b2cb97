"""``asyncrl launch --on ray``: a run's placement as Ray actors, one per process.

Pure (no Ray here): what the launcher asks Ray for, and what ``--dry-run`` prints.

- Every process of the run is one actor (ray_actor.py) with ``num_cpus=0``: Ray's
  default of one CPU per actor leaves nodes with few CPUs unable to place them, and
  the processes' CPU use is theirs, not Ray's to count.
- A worker's ``num_gpus`` is its share of its node group's ``gpus`` (placement.nodes),
  which defaults to one per GPU worker: Ray then sets ``CUDA_VISIBLE_DEVICES`` for it.
  In a run on CPU, a group's ``gpus`` given anyway go to the workers that would compute
  on them under CUDA (generate, train, logp, ref_logp), so they are held as a GPU job's
  would be.
- A grouped role with several ranks (a training group) gets a placement group of one
  bundle per rank, STRICT_PACK: its ranks meet on one machine, and Ray moves the group
  whole when its node goes. A group the placement splits over nodes gets one bundle per
  node of its, each holding that node's ranks, STRICT_SPREAD: on as many machines as the
  placement says; its ranks meet where rank 0 announces in the run directory (gangs.py).
- The scheduler runs on the head node: its address stays the one its workers dial,
  and a Ray cluster does not outlive its head anyway. Ray starts it again there, from
  its journal, if it dies.
- Names are the run's, not the nodes': ``ROLE-ray-I`` for workers of independent roles,
  ``ROLE-RANK`` for the ranks of a group, numbered over the whole run as ``asyncrl
  node`` numbers a node's. An actor restarted on another node starts its process under
  the same name, so the scheduler takes it up as the same worker.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.runtime.contract.config import RunConfig, load_config
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.launch.gpus import gpu_roles
from asyncrl.runtime.launch.plan import GROUPED_ROLES, NodePlan, node_specs
from asyncrl.transport.security import is_loopback

from .node_plan import NodeShare, cluster_nodes

__all__ = ["RayPlan", "RayProcess", "describe_plan", "ray_plan"]

# The roles that compute on a model: on GPUs under CUDA (gpus.gpu_roles).
_MODEL_ROLES = frozenset({"generate", "train", "logp", "ref_logp", "critic", "values"})
_NODE = "ray"  # in workers' names: numbered by the run, not by a machine
_CPU_PER_RANK = 0.01  # a bundle cannot be empty: what a CPU run's rank reserves


@dataclass(frozen=True)
class RayProcess:
    """One process of the run and the actor that runs it."""

    name: str  # the process's and the actor's; names its log and its worker key
    argv: tuple[str, ...]
    num_gpus: float
    # The scheduler only: its command once the journal exists (Ray started it again).
    resume_argv: tuple[str, ...] | None = None
    # Added to the process's environment (a group's rank and size). Never the worker key
    # nor the payload key: the actor derives them from the run secret, which only the run
    # directory holds.
    env: Mapping[str, str] = field(default_factory=dict)
    gang: str | None = None  # the placement group of a group's ranks; None: on its own
    rank: int = 0
    role: str = ""  # a worker's, which its worker key is bound to
    bundle: int = 0  # a rank's bundle of its group's placement group

    @property
    def scheduler(self) -> bool:
        return self.resume_argv is not None


@dataclass(frozen=True)
class RayPlan:
    """The run as Ray runs it: its processes, its groups, and where they work."""

    cfg: RunConfig  # resolved, with run.dir absolute: the actors' working directory is Ray's
    processes: tuple[RayProcess, ...]  # the scheduler first
    gangs: Mapping[str, tuple[float, int]]  # group -> (GPUs per rank, ranks)
    cwd: Path  # where the processes run (relative paths in the config resolve there)
    # group -> its ranks on each of its nodes, for a group the placement splits over nodes
    split: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run.dir)

    @property
    def namespace(self) -> str:
        """The run's Ray namespace: its name and its directory, so two runs never meet."""
        digest = hashlib.sha256(str(self.run_dir).encode()).hexdigest()[:8]
        return f"asyncrl-{self.cfg.run.name}-{digest}"

    def bundles(self, gang: str) -> list[dict[str, float]]:
        """One per rank, or for a split group one per node, holding that node's ranks:
        their GPUs, or on CPU a token (a bundle cannot be empty)."""
        ranks = [p for p in self.processes if p.gang == gang]
        held = [
            [p for p in ranks if p.bundle == b] for b in range(max(r.bundle for r in ranks) + 1)
        ]
        return [
            {"GPU": gpus}
            if (gpus := sum(p.num_gpus for p in h))
            else {"CPU": _CPU_PER_RANK * len(h)}
            for h in held
        ]

    def strategy(self, gang: str) -> str:
        """Ray's placement strategy for the group's bundles (see the module doc)."""
        return "STRICT_SPREAD" if gang in self.split else "STRICT_PACK"


def ray_plan(config: Path | None, overrides: Sequence[str], cwd: Path, python: str) -> RayPlan:
    """The plan for the run ``config`` and ``overrides`` say, launched from ``cwd``, its
    processes started by ``python``. ValueError, one line, for a run Ray cannot place."""
    run_dir = cwd / RunDir.of(load_config(config, overrides)).root
    # Every process gets the run directory absolute: Ray's actors work elsewhere.
    overrides = [*overrides, f"run.dir={run_dir}"]
    cfg = load_config(config, overrides)
    config_args = [*(["-c", str(config.resolve())] if config else []), *overrides]
    if is_loopback(cfg.scheduler.host):
        raise ValueError(
            f"scheduler.host: got {cfg.scheduler.host}, loopback, but Ray places processes "
            "on any node of its cluster; allowed: 0.0.0.0 or an address every node reaches"
        )
    shares = cluster_nodes(cfg)
    split = {
        role: tuple(s.roles[role] for s in shares if role in s.roles)
        for role in {role for s in shares for role in s.first_ranks}
    }
    totals: dict[str, int] = {}
    for share in shares:
        for role, count in share.roles.items():
            totals[role] = totals.get(role, 0) + count
    # Ray starts the ranks of a split group as one plan: named, numbered as the nodes would.
    node = NodePlan(totals, scheduler=True, node=_NODE, first_ranks=dict.fromkeys(split, 0))
    specs = node_specs(cfg, config_args, node, resume=False)
    gpus = _gpus_per_worker(cfg, shares)
    processes = []
    for spec in specs:
        argv = (python, *spec.argv[1:])  # the nodes' Python, as the launcher names it
        if not spec.restart:  # the scheduler
            resume = (python, *(spec.resume_argv or ())[1:])
            processes.append(RayProcess(spec.name, argv, 0.0, resume_argv=resume))
            continue
        # A rank's --index is its rank in its group.
        rank = int(spec.argv[spec.argv.index("--index") + 1]) if spec.gang else 0
        env = dict(spec.env or {})
        num_gpus = gpus.get(spec.name, 0.0)
        role = spec.argv[spec.argv.index("--role") + 1]
        bundle = _bundle_of(rank, split[role]) if role in split else rank
        processes.append(RayProcess(spec.name, argv, num_gpus, env=env, gang=spec.gang,
                                    rank=rank, role=role, bundle=bundle))  # fmt: skip
    gangs = {p.gang: (p.num_gpus, totals[p.gang]) for p in processes if p.gang is not None}
    return RayPlan(cfg, tuple(processes), gangs, cwd, split)


def _bundle_of(rank: int, per_node: tuple[int, ...]) -> int:
    """The node (bundle) of a split group that holds ``rank``: ranks go in node order."""
    return bisect.bisect_right(list(itertools.accumulate(per_node)), rank)


def _gpus_per_worker(cfg: RunConfig, shares: Sequence[NodeShare]) -> dict[str, float]:
    """{worker name: its num_gpus}: each node group's GPUs shared evenly by its GPU workers."""
    wanting = gpu_roles(cfg) or _MODEL_ROLES
    found: dict[str, float] = {}
    for i, share in enumerate(shares):
        names = [name for role, count in share.roles.items() if role in wanting
                 for name in _names(role, count, share)]  # fmt: skip
        if not share.gpus or not names:
            continue
        each = share.gpus / len(names)
        if each > 1 and not each.is_integer():
            raise ValueError(
                f"placement.nodes[{i}].gpus: got {share.gpus} for {len(names)} GPU workers; "
                "allowed: a multiple of them, or at most one each (Ray gives an actor a "
                "fraction of one GPU or whole GPUs)"
            )
        found.update(dict.fromkeys(names, each))
    return found


def _names(role: str, count: int, share: NodeShare) -> list[str]:
    """The names node_specs gives ``share``'s ``count`` workers of ``role``."""
    if role in GROUPED_ROLES:
        first = share.first_ranks.get(role, 0)
        return [f"{role}-{rank}" for rank in range(first, first + count)]
    first = share.first_index
    return [f"{role}-{_NODE}-{i}" for i in range(first, first + count)]


def describe_plan(plan: RayPlan) -> str:
    """What ``--dry-run`` prints: every actor with its resources and command."""
    cfg = plan.cfg
    lines = [
        f"# {cfg.run.name} on Ray: {len(plan.processes)} actors in namespace "
        f"{plan.namespace}, run.dir {plan.run_dir}, working directory {plan.cwd}",
        "# every actor: detached, num_cpus=0, max_restarts=-1 (it runs one process and "
        "dies with it)",
    ]
    for gang, (_, ranks) in plan.gangs.items():
        bundles = ", ".join(str(bundle) for bundle in plan.bundles(gang))
        lines.append(f"placement group {gang} ({ranks} ranks): {plan.strategy(gang)}, {bundles}")
    for process in plan.processes:
        where = (
            f" in placement group {process.gang} bundle {process.bundle}" if process.gang else ""
        )
        where += " on the head node" if process.scheduler else ""
        lines.append(f"actor {process.name}: num_gpus={process.num_gpus:g}{where}")
        lines.append(f"  {shlex.join(process.argv)}")
        if process.resume_argv is not None:
            lines.append(f"  once the journal exists: {shlex.join(process.resume_argv)}")
    return "\n".join(lines) + "\n"
