"""How many torch threads a worker of a role takes: torch-free, so a role that may or may
not compute (a reward model, or a rule) reads it before deciding to import torch."""

from __future__ import annotations

import os

from asyncrl.runtime.contract.config import RunConfig

__all__ = ["threads_for"]

# The roles whose compute takes turns in a synchronous run: a step generates, then trains;
# with a learned critic, values are made, then the critic trains, then the policy.
_TAKING_TURNS = ("generate", "train", "values", "critic")


def threads_for(cfg: RunConfig, role: str, cores: int | None = None) -> int:
    """torch threads for a worker of ``role`` (``backends.cpu_threads``, 0: automatic)."""
    if cfg.backends.cpu_threads > 0:
        return cfg.backends.cpu_threads
    if cfg.pipeline.max_staleness > 0 or role not in _TAKING_TURNS:
        return 1  # running side by side, each compute role keeps to a core
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores // max(1, cfg.pipeline.workers.get(role, 1)))
