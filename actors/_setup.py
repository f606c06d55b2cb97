"""What every model-holding role does at start: threads, seed, the model."""

from __future__ import annotations

import torch

from asyncrl.runtime.config import RunConfig

from .policy.checkpoint import load_model
from .policy.model import CausalLM
from .policy.tokenizer import TextCodec

__all__ = ["load_policy"]


def load_policy(cfg: RunConfig, role: str) -> tuple[CausalLM, TextCodec]:
    """The base model named by ``model.path``, on this process's share of the CPU."""
    backend = cfg.backends.train if role != "generate" else cfg.backends.generate
    if backend != "torch":
        raise RuntimeError(f"backend {backend!r} for {role} is not available; use torch")
    torch.set_num_threads(cfg.backends.cpu_threads)
    torch.manual_seed(cfg.run.seed)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    return load_model(cfg.model.path, dtype)
