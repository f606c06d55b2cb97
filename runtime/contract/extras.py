"""Optional packages a configuration asks for, checked before anything starts.

A run that wants /metrics or a TensorBoard log must not train for an hour and then fail
(or silently log nothing): ``asyncrl run`` and ``asyncrl-scheduler start`` refuse at once,
one line per missing package, naming the extra that installs it.
"""

from __future__ import annotations

import importlib.util

from asyncrl.runtime.contract.config import RunConfig

__all__ = ["missing_extras"]

# What a config key needs: (module imported, extra that installs it, what asks for it).
_BACKENDS = {
    "tensorboard": ("tensorboard", "tensorboard", "logging.backends has tensorboard"),
    "wandb": ("wandb", "wandb", "logging.backends has wandb"),
}


def missing_extras(cfg: RunConfig) -> list[str]:
    """One line per package ``cfg`` needs that is not installed; empty if none."""
    wanted = [_BACKENDS[b] for b in cfg.logging.backends if b in _BACKENDS]
    if cfg.scheduler.metrics_port:
        wanted.append(("prometheus_client", "metrics", "scheduler.metrics_port is set"))
    return [
        f"{why}, but {module} is not installed: pip install 'asyncrl[{extra}]'"
        for module, extra, why in wanted
        if importlib.util.find_spec(module) is None
    ]
