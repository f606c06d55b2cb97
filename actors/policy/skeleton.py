"""A model's structure without values: its modules and parameter shapes, no memory.

For checks before anything loads (``model_dir_check.py``, ``startup/role_checks.py``):
what a model of a ``config.json`` would hold, in a worker or a check that reads no
weights. Built on the meta device with no parameter initialised, because initialising
an embedding there (``normal_``) runs torch's Python reference kernels, whose first use
imports ``torch._dynamo``, sympy and the distributed packages: about a second of CPU in
each process that starts, for values nobody reads.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .config import ModelConfig
from .model import CausalLM

__all__ = ["skeleton"]


def skeleton(config: ModelConfig) -> CausalLM:
    """The model ``config`` describes, on the meta device, every parameter left as made."""
    with torch.device("meta"), _NoInit():
        return CausalLM(config)


class _NoInit(TorchFunctionMode):
    """``torch.nn.init``'s functions give back their tensor untouched; all else as usual."""

    def __torch_function__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else (kwargs or {})["tensor"]
        return func(*args, **(kwargs or {}))
