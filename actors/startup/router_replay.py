"""Router replay (``algorithm.router_replay``): which roles replay the generator's routes,
and what refuses it before a run starts, one line each naming the field."""

from __future__ import annotations

import json

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.stages import Role

__all__ = ["replays_routes", "router_replay_problems"]


def replays_routes(cfg: RunConfig, role: str) -> bool:
    """Whether ``role`` routes each token through the experts the generator recorded."""
    replay = cfg.algorithm.router_replay
    if not replay.enabled:
        return False
    if role == Role.REF_LOGP.value:
        return replay.ref_logp
    return role in (Role.LOGP.value, Role.TRAIN.value)


def router_replay_problems(cfg: RunConfig, role: str) -> list[str]:
    """Why router replay cannot run for ``role`` (the generator records; logp, ref_logp
    and train replay); [] when it is off or can."""
    if not cfg.algorithm.router_replay.enabled:
        return []
    problems = []
    if role == Role.GENERATE.value and cfg.backends.generate != "torch":
        problems.append(_ENGINE_CANNOT[cfg.backends.generate])
    if role == Role.GENERATE.value and cfg.data.harness:
        problems.append(
            "algorithm.router_replay.enabled with data.harness: a harness's calls through "
            "the served API do not record routes; turn one of them off"
        )
    pipeline = cfg.backends.megatron.pipeline_parallel
    if replays_routes(cfg, role) and cfg.backends.train == "megatron" and pipeline > 1:
        # Stages overlapping micro-batches (1F1B) would each need their own replay set
        # for every forward; not wired.
        problems.append(
            f"algorithm.router_replay.enabled with backends.megatron.pipeline_parallel="
            f"{pipeline}: megatron replays routes here without pipeline stages only; use 1"
        )
    if _has_no_experts(cfg.model.path):
        problems.append(
            f"algorithm.router_replay.enabled: the model at model.path={cfg.model.path!r} "
            "has no mixture-of-experts layers to replay"
        )
    return problems


_ENGINE_CANNOT = {
    # vLLM 0.32 returns the experts it routed to (enable_return_routed_experts) only from
    # its V2 model runner, which needs Triton: not on CPU, and not what the engine here runs.
    "vllm": (
        "algorithm.router_replay.enabled with backends.generate='vllm': vLLM returns its "
        "routes only from its V2 model runner, which this engine does not run; use "
        "backends.generate=torch"
    ),
    "sglang": (
        "algorithm.router_replay.enabled with backends.generate='sglang': this SGLang "
        "adapter does not record the routes SGLang chose; use backends.generate=torch"
    ),
}


def _has_no_experts(path: str) -> bool:
    """True when ``model.path`` reads as a model of ours without experts (a directory that
    does not read is check_model's to name)."""
    from ..policy.config import ModelConfig
    from ..policy.directories import packaged_or_path

    try:
        config = json.loads((packaged_or_path(path) / "config.json").read_text())
        return ModelConfig.from_hf(config).experts is None
    except (OSError, ValueError, KeyError):
        return False
