"""Training engines other than the built-in PyTorch one, chosen by ``backends.train``.

Each engine lives in its own subpackage and imports its library only there, so the
default install (``backends.train=torch``) never imports, or needs, any of them. What
every model-holding role asks before it starts is answered here, in one place.
"""

from __future__ import annotations

import importlib

from asyncrl.runtime.config import RunConfig

__all__ = ["MEGATRON_MISSING", "train_engine_problems"]

MEGATRON_MISSING = "backends.train='megatron' needs megatron-core: pip install 'asyncrl[gpu]'"
# The roles whose model backends.train picks (generate has backends.generate).
_ENGINE_ROLES = ("train", "logp", "ref_logp")


def train_engine_problems(cfg: RunConfig, role: str) -> list[str]:
    """Why ``role`` cannot run on ``backends.train`` here, one line each; [] if it can."""
    if cfg.backends.train == "torch":
        return []
    missing = _megatron_missing()
    if missing:
        return [missing]
    ranks = cfg.pipeline.workers.get(role, 1)
    if role in _ENGINE_ROLES and ranks > 1:
        # The FSDP2 group code shards a CausalLM; megatron's own groups are not wired to
        # the gang yet, so a group would train a wrong split rather than fail.
        return [
            f"pipeline.workers.{role}={ranks} with backends.train='megatron': the megatron "
            "engine runs one rank per worker in this build; use 1"
        ]
    return []


def _megatron_missing() -> str | None:
    try:
        importlib.import_module("megatron.core")
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] == "megatron":
            return MEGATRON_MISSING
        return f"{MEGATRON_MISSING} (importing it failed: {error})"
    except ImportError as error:  # installed, but something it needs is not
        return f"{MEGATRON_MISSING} (importing it failed: {error})"
    return None
