"""Where a run's processes go on a cluster: the ``placement`` section.

One placement for every engine (``asyncrl launch --on ENGINE``): nodes in groups of
alike nodes, each group with the roles every one of its nodes runs (workers per node;
for a grouped role, its ranks, the whole group on one node), the scheduler on the first
node, and the GPUs each node is given. Roles in one group share its nodes. The checks
against the run (every role of its pipeline placed; a grouped role's ranks equal to its
``pipeline.workers``) are the launcher's, which knows the pipeline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Role

from .fields import doc

__all__ = ["SCHEDULER", "KubernetesSection", "NodeGroup", "PlacementSection"]

SCHEDULER = "scheduler"
_ROLES = (*DEFAULT_PIPELINE.worker_roles, Role.HARNESS.value)
# Kubernetes' own rules for the names and sizes given here (RFC 1123 names, quantities).
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeGroup:
    count: int = field(default=1, metadata=doc("nodes alike in this group", min=1))
    roles: dict[str, int] = field(
        default_factory=dict,
        metadata=doc(
            "workers of each role on every node of the group (a grouped role: its ranks); "
            "scheduler: 1 puts the scheduler on the group's one node",
            min=1,
            keys=(SCHEDULER, *_ROLES),
        ),
    )
    gpus: int | None = field(
        default=None,
        metadata=doc("GPUs per node; default one per GPU worker of the node", min=0),
    )

    def __post_init__(self) -> None:
        if not self.roles:
            raise ValueError("roles: got none; allowed: the roles each node of the group runs")
        if self.roles.get(SCHEDULER, 1) != 1:
            raise ValueError(f"roles: got scheduler: {self.roles[SCHEDULER]}; allowed: 1")
        if SCHEDULER in self.roles and self.count != 1:
            raise ValueError(
                f"count: got {self.count} with the scheduler; allowed: 1 (a run has one "
                "scheduler: give it a group of one node)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class KubernetesSection:
    """For ``asyncrl launch --on kubernetes``; image and run_claim are needed there only."""

    image: str = field(
        default="",
        metadata=doc("container image with asyncrl and the run's code (needed to launch)"),
    )
    namespace: str = field(default="default", metadata=doc("namespace of the run's objects"))
    run_claim: str = field(
        default="",
        metadata=doc(
            "ReadWriteMany PersistentVolumeClaim (made beforehand, it outlives the run) "
            "mounted at /asyncrl in every pod, their working directory: run.dir is on it "
            "(needed to launch)"
        ),
    )
    journal_size: str = field(
        default="10Gi", metadata=doc("the scheduler's journal volume (a quantity: 10Gi)")
    )
    journal_storage_class: str = field(
        default="", metadata=doc("storage class of the journal volume; none: the default")
    )
    service_account: str = field(
        default="", metadata=doc("the pods' service account; none: the namespace's default")
    )
    run_as_user: int = field(
        default=1000,
        metadata=doc(
            "uid every pod runs as (never root); the run claim must be writable by it", min=1
        ),
    )
    run_as_group: int = field(
        default=1000,
        metadata=doc("gid every pod runs as, and its volumes' group (fsGroup)", min=1),
    )
    shm_size: str = field(
        default="64Gi",
        metadata=doc(
            "each pod's /dev/shm (memory-backed: staged weights, trainer state, payloads), "
            "a quantity; counted against the node's memory"
        ),
    )

    def __post_init__(self) -> None:
        if any(c.isspace() for c in self.image):
            raise ValueError(f"image: got {self.image!r}; allowed: an image reference")
        if not _DNS_LABEL.match(self.namespace):
            raise ValueError(f"namespace: got {self.namespace!r}; allowed: {_LABEL_RULE}")
        for key in ("run_claim", "journal_storage_class", "service_account"):
            value = getattr(self, key)
            if value and not _DNS_NAME.match(value):
                raise ValueError(f"{key}: got {value!r}; allowed: {_NAME_RULE}")
        for key in ("journal_size", "shm_size"):
            if not _QUANTITY.match(getattr(self, key)):
                raise ValueError(
                    f"{key}: got {getattr(self, key)!r}; allowed: a quantity, e.g. 10Gi"
                )


_LABEL_RULE = "lower-case letters, digits and '-', at most 63, a letter or digit at each end"
_NAME_RULE = f"{_LABEL_RULE}; '.' between such parts"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementSection:
    nodes: tuple[NodeGroup, ...] = field(
        default=(),
        metadata=doc("groups of nodes, the scheduler's first; none: one node runs the whole run"),
    )
    sbatch: tuple[str, ...] = field(
        default=(),
        metadata=doc("more sbatch options for --on slurm, e.g. --partition=gpu, --time=4:00:00"),
    )

    kubernetes: KubernetesSection = field(
        default_factory=KubernetesSection, metadata=doc("for --on kubernetes")
    )

    def __post_init__(self) -> None:
        holders = [i for i, group in enumerate(self.nodes) if SCHEDULER in group.roles]
        if self.nodes and holders != [0]:
            where = f"groups {holders}" if holders else "no group"
            raise ValueError(
                f"nodes: got the scheduler in {where}; allowed: scheduler: 1 in the first "
                "group only (its node is the one the others find the scheduler on)"
            )
        for option in self.sbatch:
            if not option.startswith("--") or "\n" in option:
                raise ValueError(
                    f"sbatch: got {option!r}; allowed: long options on one line, e.g. "
                    "--partition=gpu"
                )
