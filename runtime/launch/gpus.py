"""Which GPUs this machine has, and which worker gets which: one each, in order.

A machine supervisor hands each worker that computes on a GPU one device through
``CUDA_VISIBLE_DEVICES`` in its environment, so the worker sees exactly one GPU (its
``cuda:0``) and no two workers pick the same one by their index. Workers of CPU roles
(dataloader, reward, harness) get none; a run on CPU gets none at all. Found without
importing torch: ``CUDA_VISIBLE_DEVICES`` as the supervisor was given it, else the GPUs
``nvidia-smi -L`` lists.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence

from asyncrl.runtime.contract.config import RunConfig

__all__ = [
    "VISIBLE_ENV",
    "gpu_roles",
    "gpus_per_worker",
    "hand_out",
    "machine_gpus",
    "parse_gpus",
    "visible_gpus",
]

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
_SMI_LINE = re.compile(r"^GPU (\d+):", re.MULTILINE)


def gpu_roles(cfg: RunConfig) -> frozenset[str]:
    """The roles whose workers compute on a GPU in ``cfg``."""
    roles = set()
    if cfg.backends.device == "cuda":
        roles |= {"generate", "train", "logp", "ref_logp", "critic", "values"}
    if cfg.backends.generate == "sglang":
        roles.add("generate")  # SGLang runs on CUDA whatever backends.device says
    return frozenset(roles)


def parse_gpus(text: str) -> tuple[str, ...]:
    """``--gpus 0,1,2`` (indices or UUIDs, as CUDA_VISIBLE_DEVICES takes them)."""
    gpus = tuple(part.strip() for part in text.split(","))
    if not all(gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {text!r}: give distinct GPUs separated by commas, e.g. 0,1,2")
    return gpus


def visible_gpus(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES names them; () without any."""
    env = os.environ if env is None else env
    given = env.get(VISIBLE_ENV)
    if given is not None:
        # CUDA stops at the first entry it cannot use; "-1" (or "") hides every GPU.
        gpus = []
        for part in (part.strip() for part in given.split(",")):
            if not part or part.startswith("-"):
                break
            gpus.append(part)
        return tuple(gpus)
    return _listed_by_nvidia_smi()


def _listed_by_nvidia_smi() -> tuple[str, ...]:
    try:
        found = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):  # no driver here, or a hung one
        return ()
    return tuple(_SMI_LINE.findall(found.stdout)) if found.returncode == 0 else ()


def hand_out(
    workers: Sequence[tuple[str, str]],
    roles: frozenset[str],
    gpus: Sequence[str],
    per_worker: Mapping[str, int] | None = None,
) -> dict[str, str]:
    """``{worker name: its GPUs}`` (as CUDA_VISIBLE_DEVICES takes them) for the ``(name,
    role)`` of ``workers`` whose role is in ``roles``, in their order: one GPU each, or
    ``per_worker[role]`` GPUs for a worker whose engine splits its model over several;
    with more wanted than there are, the GPUs are handed out again from the first
    (shared, as every worker shared GPU 0 before)."""
    if not gpus:
        return {}
    wanting = [(name, role) for name, role in workers if role in roles]
    given, at = {}, 0
    for name, role in wanting:
        count = (per_worker or {}).get(role, 1)
        given[name] = ",".join(gpus[(at + k) % len(gpus)] for k in range(count))
        at += count
    return given


def gpus_per_worker(cfg: RunConfig) -> dict[str, int]:
    """The roles whose workers each need several GPUs in ``cfg``: a vLLM engine split over
    ``backends.vllm.tensor_parallel_size`` ranks, one GPU each."""
    if cfg.backends.generate == "vllm" and cfg.backends.device == "cuda":
        return {"generate": cfg.backends.vllm.tensor_parallel_size}
    return {}


def machine_gpus(cfg: RunConfig, given: str | None = None) -> tuple[str, ...]:
    """The GPUs to hand out: ``given`` (``--gpus``), else those found here; none for a run
    that computes on CPU only (nothing is looked for then)."""
    if given is not None:
        if not gpu_roles(cfg):
            raise ValueError(f"--gpus {given}: this run computes on CPU (backends.device=cpu)")
        return parse_gpus(given)
    return visible_gpus() if gpu_roles(cfg) else ()
