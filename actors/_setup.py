"""What every model-holding role does at start: threads, the model, the task, weights."""

from __future__ import annotations

from pathlib import Path

import torch

from asyncrl.runtime.config import RunConfig
from asyncrl.transport.weights import WeightSync, make_weight_sync

from .policy.checkpoint import load_model, load_state
from .policy.model import CausalLM
from .policy.tokenizer import TextCodec

__all__ = ["load_policy", "load_version", "weight_sync"]


def load_policy(cfg: RunConfig, role: str) -> tuple[CausalLM, TextCodec]:
    """The base model named by ``model.path``, on this process's share of the CPU."""
    backend = cfg.backends.train if role != "generate" else cfg.backends.generate
    if backend != "torch":
        raise RuntimeError(f"backend {backend!r} for {role} is not available; use torch")
    torch.set_num_threads(cfg.backends.cpu_threads)
    torch.manual_seed(cfg.run.seed)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    return load_model(cfg.model.path, dtype)


def weight_sync(cfg: RunConfig) -> WeightSync:
    return make_weight_sync(cfg.weights.strategy, Path(cfg.run.dir))


def load_version(model: CausalLM, sync: WeightSync, version: int) -> float | None:
    """Copy ``version``'s published weights into ``model``; seconds taken, or None if gone."""
    fetched = sync.fetch(version)
    if fetched is None:
        return None
    load_state(model, fetched.state)
    return fetched.seconds
