"""``asyncrl run``: a whole pipeline on this machine, as the config describes it.

The one-machine case of ``asyncrl node`` (node.py): the scheduler and ``pipeline.workers``
of every role, started by the supervisor with the same configuration arguments, so each
resolves the same config; workers find the scheduler through ``<run.dir>/endpoints.json``
(ports may be 0: picked by the OS).
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.runtime.contract.config import RunConfig

from .gpus import machine_gpus
from .node import preflight, run_node
from .plan import GROUPED_ROLES, WORKER_MODULE, NodePlan

__all__ = ["GROUPED_ROLES", "WORKER_MODULE", "preflight", "run_locally"]


def run_locally(cfg: RunConfig, config_args: Sequence[str], *, resume: bool) -> int:
    plan = NodePlan.whole_run(cfg, gpus=machine_gpus(cfg))
    return run_node(cfg, config_args, plan, resume=resume, prog="asyncrl run")
