"""What one machine runs of a run, and the command line of each of its processes.

``asyncrl run`` is the plan with the scheduler and every role's ``pipeline.workers``
workers; ``asyncrl node --roles generate=2,logp`` is the plan with this machine's share,
and ``asyncrl node --roles train@1`` runs rank 1 of the trainer's group, whose other
ranks other machines run.

Names: the scheduler knows a worker by its name, and a worker started again under the
same name (with the same worker key) is the same worker. So names are unique across a
run's machines: a worker of a role that runs as many independent workers (dataloader,
generate, reward, harness) is ``ROLE-NODE-I`` on a node (``ROLE-I`` under ``asyncrl
run``), and a grouped role (train, critic, logp, ref_logp: ``pipeline.workers[role]`` ranks of
one group) has one group in the whole run, whose ranks are ``ROLE-RANK`` on whichever
machine runs them. A group one machine runs whole meets at an address its supervisor
gives; a group split over machines meets where its leader announces (gangs.py).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from asyncrl.runtime.contract.bus import serves_ipc
from asyncrl.runtime.contract.config import RunConfig, pipeline_for, workers_to_start
from asyncrl.runtime.contract.config.schema import WORKER_ROLES
from asyncrl.runtime.contract.gangs import ENV_RANK, ENV_SIZE
from asyncrl.transport.identity import worker_env

from .gpus import VISIBLE_ENV, gpu_roles, gpus_per_worker, hand_out
from .supervisor import ChildSpec

__all__ = [
    "GROUPED_ROLES",
    "SCHEDULER",
    "WORKER_MODULE",
    "NodePlan",
    "NodeRoles",
    "node_specs",
    "parse_roles",
]

# Workers are started by module name: the launcher runs role code, it never imports it.
WORKER_MODULE = "asyncrl.actors.cli"
# Roles whose workers form one group of ranks (pipeline.workers.train=N: N ranks of one
# sharded trainer; critic: of the learned critic; logp, ref_logp: of one sharded scorer),
# rather than N independent workers.
GROUPED_ROLES = frozenset({"train", "critic", "logp", "ref_logp"})
SCHEDULER = "scheduler"  # in --roles: this machine runs the scheduler too
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_RANKS = re.compile(r"^(\d+)(?:-(\d+))?$")


@dataclass(frozen=True)
class NodePlan:
    """The processes one machine runs: the scheduler or not, and workers per role."""

    roles: Mapping[str, int]  # role -> this machine's workers (a grouped role: its ranks)
    scheduler: bool = False
    node: str | None = None  # names workers ROLE-NODE-I; None: ROLE-I (asyncrl run)
    first_index: int = 0  # the first I of this machine's workers of each role
    gpus: tuple[str, ...] = ()  # handed out one per GPU worker (gpus.py)
    dial: str | None = None  # --scheduler for the workers; None: the run dir's endpoints
    # A grouped role of which this machine runs only some ranks: its first rank here (its
    # count in ``roles``); the group's other ranks are on other machines.
    first_ranks: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def whole_run(cls, cfg: RunConfig, gpus: tuple[str, ...] = ()) -> NodePlan:
        """``asyncrl run``: the scheduler and ``pipeline.workers`` of every role."""
        return cls(workers_to_start(cfg), scheduler=True, gpus=gpus)

    def __post_init__(self) -> None:
        if self.node is not None and not _NODE_NAME.match(self.node):
            raise ValueError(
                f"--node {self.node!r}: letters, digits, '.', '_' and '-' only (it names workers)"
            )
        if self.first_index < 0:
            raise ValueError(f"--first-index {self.first_index}: 0 or more")


class NodeRoles(NamedTuple):
    """What ``--roles`` asks of a machine (see :func:`parse_roles`)."""

    roles: dict[str, int]  # role -> workers here (a grouped role: its ranks here)
    scheduler: bool  # the machine runs the scheduler too
    first_ranks: dict[str, int]  # a grouped role split over machines: its first rank here


def parse_roles(text: str, cfg: RunConfig) -> NodeRoles:
    """``generate=2,logp,train@0-1,scheduler`` -> ({generate: 2, logp: N, train: 2}, runs
    the scheduler, {train: 0}).

    A role alone means its ``pipeline.workers`` count. A grouped role is one group of
    ``pipeline.workers[role]`` ranks: given alone or with that count, this machine runs it
    whole; ``ROLE@R`` or ``ROLE@R-S`` runs only rank R (to S) of it, the others being on
    other machines. ValueError names what is wrong, in one line.
    """
    known = pipeline_for(cfg).worker_roles
    roles: dict[str, int] = {}
    first_ranks: dict[str, int] = {}
    scheduler = False
    for part in (part.strip() for part in text.split(",")):
        role, at, ranks_text = part.partition("@")
        role, sep, count_text = role.partition("=")
        role = role.strip()
        if role == SCHEDULER:
            if count_text.strip() not in ("", "1"):
                raise ValueError(f"--roles: {part}: a run has one scheduler")
            scheduler = True
            continue
        if role not in known:
            have = ", ".join([*known, SCHEDULER])
            what = "has no work in this run" if role in WORKER_ROLES else "is no role"
            raise ValueError(f"--roles: {role!r} {what}; the run's roles: {have}")
        if role in roles:
            raise ValueError(f"--roles: {role} is given twice")
        configured = cfg.pipeline.workers.get(role, 0)
        if at:
            first, count = _ranks(role, ranks_text, configured, sep)
            if (first, count) != (0, configured):
                first_ranks[role] = first
            roles[role] = count
            continue
        count = _count(role, count_text) if sep else configured
        if role in GROUPED_ROLES and count != configured and max(count, configured) > 1:
            group = f"one group of {configured} ranks" if configured > 1 else "one worker"
            raise ValueError(
                f"--roles: {role}={count}, but {role} is {group} in this run "
                f"(pipeline.workers.{role}={configured}): give {role} for the whole group "
                f"on one machine, {role}@R-S for some of its ranks, or set "
                f"pipeline.workers.{role} on every machine"
            )
        if count < 1:
            raise ValueError(f"--roles: {role} has no workers (pipeline.workers.{role}=0)")
        roles[role] = count
    return NodeRoles(roles, scheduler, first_ranks)


def _ranks(role: str, text: str, configured: int, counted: str) -> tuple[int, int]:
    """``R`` or ``R-S`` of ``ROLE@...``: the first rank and how many, of ``configured``."""
    if role not in GROUPED_ROLES:
        raise ValueError(
            f"--roles: {role}@{text}: only a group of ranks ({', '.join(sorted(GROUPED_ROLES))}) "
            "is split by rank"
        )
    if counted:
        raise ValueError(f"--roles: give {role}@{text} or {role}=N, not both")
    found = _RANKS.match(text.strip())
    if found is None:
        raise ValueError(f"--roles: {role}@{text!r}: ranks are R or R-S, e.g. {role}@1")
    first = int(found[1])
    last = int(found[2]) if found[2] is not None else first
    if not first <= last < configured:
        raise ValueError(
            f"--roles: {role}@{text}: the group has ranks 0 to {configured - 1} "
            f"(pipeline.workers.{role}={configured})"
        )
    return first, last - first + 1


def _count(role: str, text: str) -> int:
    text = text.strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--roles: {role}={text!r}: the count must be a whole number, 1 or more")
    return int(text)


def node_specs(
    cfg: RunConfig,
    config_args: Sequence[str],
    plan: NodePlan,
    *,
    resume: bool,
    run_secret: bytes = b"",
) -> list[ChildSpec]:
    """The scheduler first (the primary) if the plan has it, then the plan's workers.

    With ``run_secret`` each worker gets its worker key, bound to its name and role, and
    the run's payload key in its environment (never on its command line, which any user
    may read): restarted under the same name, it is known to the scheduler as the same
    worker at once (transport/identity.py).
    """
    specs = [_scheduler_spec(cfg, config_args, resume)] if plan.scheduler else []
    workers = list(_workers(plan, cfg))
    gpu_of = hand_out(
        [(w[0], w[1]) for w in workers], gpu_roles(cfg), plan.gpus, gpus_per_worker(cfg)
    )
    dial = ["--scheduler", plan.dial] if plan.dial else []
    for name, role, index, ranks in workers:
        argv = [sys.executable, "-m", WORKER_MODULE, "--role", role, "--index", str(index)]
        if plan.node is not None and role not in GROUPED_ROLES:
            argv += ["--name", name]
        env: dict[str, str] = {}
        if run_secret:
            env.update(worker_env(run_secret, name, role))
        if name in gpu_of:
            env[VISIBLE_ENV] = gpu_of[name]
        if ranks is not None:
            # One group of ranks, rank 0 its leader (the only one the scheduler sees).
            env.update({ENV_RANK: str(index), ENV_SIZE: str(ranks)})
        gang = role if ranks is not None else None
        full = [*argv, *dial, *config_args]
        split = role in plan.first_ranks  # its group meets where its leader announces
        specs.append(
            ChildSpec(name, full, True, env=env or None, gang=gang, gang_across_machines=split)
        )
    return specs


def _scheduler_spec(cfg: RunConfig, config_args: Sequence[str], resume: bool) -> ChildSpec:
    start = [sys.executable, "-m", "asyncrl.runtime.scheduler.cli", "start", *config_args]
    if serves_ipc(cfg.scheduler):
        start.append("--ipc")  # every process is on this host: no TCP port for others
    # A scheduler that dies resumes from its journal; its workers find it again.
    resumed = [*start, "--resume"]
    return ChildSpec(SCHEDULER, resumed if resume else start, restart=False, resume_argv=resumed)


def _workers(plan: NodePlan, cfg: RunConfig) -> Iterator[tuple[str, str, int, int | None]]:
    """(name, role, index, ranks of its group or None) of each worker of ``plan``."""
    for role, count in plan.roles.items():
        if role in GROUPED_ROLES:
            # One group per run: its ranks' names need no machine's.
            first = plan.first_ranks.get(role, 0)
            size = cfg.pipeline.workers.get(role, count) if role in plan.first_ranks else count
            ranks = size if size > 1 else None
            for rank in range(first, first + count):
                yield f"{role}-{rank}", role, rank, ranks
            continue
        for index in range(plan.first_index, plan.first_index + count):
            prefix = role if plan.node is None else f"{role}-{plan.node}"
            yield f"{prefix}-{index}", role, index, None
