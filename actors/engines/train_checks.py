"""What a role of a training engine (``backends.train``) asks before it starts: whether
the engine is installed, and whether the model at ``model.path`` splits the way
``backends.megatron`` asks. One line per problem, naming it; nothing is imported (megatron
is found, not loaded: that takes seconds)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from asyncrl.runtime.contract.config import MegatronSection, RunConfig

if TYPE_CHECKING:
    from ..policy.config import Experts

__all__ = ["MEGATRON_MISSING", "train_engine_problems"]

MEGATRON_MISSING = "backends.train='megatron' needs megatron-core: pip install 'asyncrl[gpu]'"


def train_engine_problems(cfg: RunConfig, role: str) -> list[str]:
    """Why ``role`` cannot run on ``backends.train`` here, one line each; [] if it can."""
    if cfg.backends.train == "torch":
        return []
    missing = _megatron_missing()
    if missing:
        return [missing]
    m = cfg.backends.megatron
    if m.expert_parallel > 1 and m.tensor_parallel > 1:
        # megatron asks for sequence parallelism with both, which is not wired.
        return [
            f"backends.megatron: expert_parallel={m.expert_parallel} with "
            f"tensor_parallel={m.tensor_parallel}: megatron needs sequence parallelism for "
            "both, which is not wired; use one of them"
        ]
    return _expert_problems(cfg.backends.megatron, cfg.model.path)


def _expert_problems(m: MegatronSection, path: str) -> list[str]:
    """What the model at ``path`` (its experts, or none) rules out of ``m``'s split."""
    if m.tensor_parallel == 1 and m.expert_parallel == 1:
        return []
    readable, experts = _experts_of(path)
    if not readable:
        return []  # the model's own check names that
    if experts is not None and m.tensor_parallel > 1:
        # megatron's MoE layer trains over tensor-parallel ranks only with sequence
        # parallelism (it raises otherwise), which this engine does not wire.
        return [
            f"backends.megatron.tensor_parallel={m.tensor_parallel} with the "
            f"mixture-of-experts model at model.path={path!r}: megatron splits its experts "
            "over tensor-parallel ranks only with sequence parallelism, which is not wired; "
            "use tensor_parallel=1 (expert_parallel splits the experts)"
        ]
    if m.expert_parallel == 1:
        return []
    if experts is None:
        return [
            f"backends.megatron.expert_parallel={m.expert_parallel}: the model at "
            f"model.path={path!r} has no experts to split; use 1"
        ]
    if experts.count % m.expert_parallel:
        return [
            f"backends.megatron.expert_parallel={m.expert_parallel}: the {experts.count} "
            f"experts of the model at model.path={path!r} do not split evenly over "
            f"{m.expert_parallel} ranks; use a divisor of {experts.count}"
        ]
    return []


def _experts_of(path: str) -> tuple[bool, Experts | None]:
    """(whether ``model.path``'s config.json reads as a model of ours, its experts)."""
    import json

    from ..policy.config import ModelConfig
    from ..policy.directories import packaged_or_path

    try:
        config = json.loads((packaged_or_path(path) / "config.json").read_text())
        return True, ModelConfig.from_hf(config).experts
    except (OSError, ValueError, KeyError):
        return False, None


def _megatron_missing() -> str | None:
    """MEGATRON_MISSING unless megatron-core is installed (found, not imported: importing
    it takes seconds and warns about the optional packages it does without)."""
    try:
        found = importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:  # no megatron package at all
        found = False
    return None if found else MEGATRON_MISSING
