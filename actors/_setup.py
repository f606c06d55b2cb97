"""What every model-holding role does at start: threads, seed, the model."""

from __future__ import annotations

import os

import torch

from asyncrl.runtime.config import RunConfig

from .policy.checkpoint import load_model
from .policy.model import CausalLM
from .policy.tokenizer import TextCodec

__all__ = ["load_policy", "threads_for"]

# The roles whose compute takes turns in a synchronous run: a step generates, then trains.
_TAKING_TURNS = ("generate", "train")


def threads_for(cfg: RunConfig, role: str, cores: int | None = None) -> int:
    """torch threads for a worker of ``role`` (``backends.cpu_threads``, 0: automatic)."""
    if cfg.backends.cpu_threads > 0:
        return cfg.backends.cpu_threads
    if cfg.pipeline.max_staleness > 0 or role not in _TAKING_TURNS:
        return 1  # running side by side, each compute role keeps to a core
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores // max(1, cfg.pipeline.workers.get(role, 1)))


def load_policy(cfg: RunConfig, role: str) -> tuple[CausalLM, TextCodec]:
    """The base model named by ``model.path``, on this process's share of the CPU."""
    backend = cfg.backends.train if role != "generate" else cfg.backends.generate
    if backend != "torch":
        raise RuntimeError(f"backend {backend!r} for {role} is not available; use torch")
    torch.set_num_threads(threads_for(cfg, role))
    torch.manual_seed(cfg.run.seed)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    return load_model(cfg.model.path, dtype)
