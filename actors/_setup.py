"""What every model-holding role does at start: threads, seed, the model."""

from __future__ import annotations

import os

import torch

from asyncrl.runtime.config import RunConfig

from .policy.checkpoint import load_model
from .policy.model import CausalLM
from .policy.tokenizer import TextCodec

__all__ = ["device_for", "load_policy", "threads_for"]

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


def device_for(cfg: RunConfig, index: int | None) -> torch.device:
    """``backends.device`` for this worker: on CUDA, the GPU its index (or rank) picks."""
    if cfg.backends.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("backends.device is cuda, but torch sees no CUDA device here")
    return torch.device("cuda", (index or 0) % torch.cuda.device_count())


def load_policy(cfg: RunConfig, role: str, index: int | None = None) -> tuple[CausalLM, TextCodec]:
    """The base model named by ``model.path``, on this process's share of the CPU, or on
    its GPU (``backends.device``)."""
    backend = cfg.backends.train if role != "generate" else cfg.backends.generate
    if backend != "torch":
        raise RuntimeError(f"backend {backend!r} for {role} is not available; use torch")
    torch.set_num_threads(threads_for(cfg, role))
    torch.manual_seed(cfg.run.seed)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.model.dtype]
    # The trainer keeps float32 master weights and computes in model.dtype (autocast, in
    # the Learner): AdamW's updates at RL learning rates (1e-6 of a weight) are below
    # bfloat16's resolution (2**-8 of it) and would round away on bfloat16 weights.
    model, codec = load_model(cfg.model.path, torch.float32 if role == "train" else dtype)
    model.gradient_checkpointing = role == "train" and cfg.model.gradient_checkpointing
    device = device_for(cfg, index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        model = model.to(device)
    return model, codec
