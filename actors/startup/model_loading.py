"""What every model-holding role does at start: threads, seed, the model on its device and
engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from asyncrl.runtime.contract.config import LoraSection, RunConfig

from ..critic.model import ValueModel, load_value_model
from ..engines.contract import EngineModel
from ..engines.train_checks import train_engine_problems
from ..policy.adapters import MergedAdapters
from ..policy.checkpoint import load_model, model_dir
from ..policy.lora import add_adapters
from ..policy.model import CausalLM, ModelConfig
from ..policy.tokenizer import TextCodec
from ..worker.threads import threads_for

if TYPE_CHECKING:
    from ..engines.sglang.runner import EngineRunner
    from ..engines.vllm.engine import VLLMEngine

__all__ = ["DTYPES", "device_for", "load_critic", "load_policy", "start_sglang", "start_vllm"]

# Of its GPU's memory, what SGLang takes for weights and KV cache when the other roles
# compute on the GPUs too (backends.device=cuda); alone on it, SGLang's default (most).
SGLANG_SHARED_MEM_FRACTION = 0.5


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # model.dtype


def device_for(cfg: RunConfig, index: int | None) -> torch.device:
    """``backends.device`` for this worker: on CUDA, the GPU its index (or rank) picks."""
    if cfg.backends.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("backends.device is cuda, but torch sees no CUDA device here")
    return torch.device("cuda", (index or 0) % torch.cuda.device_count())


def load_critic(
    cfg: RunConfig, role: str, index: int | None, path: str
) -> tuple[ValueModel, TextCodec]:
    """The critic's value model from ``path`` for ``role`` (critic or values), on this
    process's share of the CPU as every model's (left to torch, it took every core and
    starved the generator of an asynchronous run), or on its GPU. float32 for the critic,
    whose weights are its master weights, and for values on the CPU, where a version's
    received buffers then become the model's own, uncopied; else ``model.dtype``. Both
    keep the same ``critic.layers``, so the versions they pass fit either."""
    torch.set_num_threads(threads_for(cfg, role))
    device = device_for(cfg, index)
    on_gpu = role != "critic" and device.type == "cuda"
    dtype = DTYPES[cfg.model.dtype] if on_gpu else torch.float32
    return load_value_model(path, dtype, device, layers=cfg.critic.layers)


def load_policy(
    cfg: RunConfig, role: str, index: int | None = None
) -> tuple[CausalLM | EngineModel, TextCodec]:
    """The base model named by ``model.path``, on this process's share of the CPU, or on
    its GPU (``backends.device``); held by the engine ``backends.train`` names for every
    role but generate."""
    backend = cfg.backends.train if role != "generate" else cfg.backends.generate
    if role == "generate" and backend != "torch":
        raise RuntimeError(f"backend {backend!r} for {role} is not available; use torch")
    problems = train_engine_problems(cfg, role) if role != "generate" else []
    if problems:
        raise RuntimeError(problems[0])
    torch.set_num_threads(threads_for(cfg, role))
    torch.manual_seed(cfg.run.seed)
    dtype = DTYPES[cfg.model.generator_dtype if role == "generate" else cfg.model.dtype]
    # The trainer keeps float32 master weights and computes in model.dtype (autocast, in
    # the Learner): AdamW's updates at RL learning rates (1e-6 of a weight) are below
    # bfloat16's resolution (2**-8 of it) and would round away on bfloat16 weights.
    weights_dtype = torch.float32 if role == "train" else dtype
    if backend == "megatron":
        return _load_megatron(cfg, role, weights_dtype, device_for(cfg, index))
    model, codec = load_model(cfg.model.path, weights_dtype)
    model.gradient_checkpointing = role == "train" and cfg.model.gradient_checkpointing
    device = device_for(cfg, index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        model = model.to(device)
    if cfg.model.lora.enabled:
        _with_adapters(model, cfg.model.lora, role)
    return model, codec


def _with_adapters(model: CausalLM, spec: LoraSection, role: str) -> None:
    """A LoRA run: the trainer trains adapters on the frozen base; generate and logp take
    versions that are adapters, merged onto the base they keep; ref_logp is the base."""
    if role == "train":
        add_adapters(model, spec)
    elif role in ("generate", "logp"):
        model.adapters = MergedAdapters(model, spec.target_modules, spec.scale)


def _load_megatron(
    cfg: RunConfig, role: str, dtype: torch.dtype, device: torch.device
) -> tuple[EngineModel, TextCodec]:
    from asyncrl.runtime.contract.config import MegatronSection

    from ..engines.megatron.model import load_megatron

    if device.type == "cuda":
        torch.cuda.set_device(device)
    # The parallel sizes split a group of ranks (the trainer's, a scorer's); alone, a
    # worker holds the whole model.
    sizes = cfg.backends.megatron if cfg.pipeline.workers.get(role, 1) > 1 else MegatronSection()
    return load_megatron(cfg.model.path, dtype, device, sizes)


def _engine_model(cfg: RunConfig) -> tuple[Path, ModelConfig, int]:
    """For an engine that loads ``model.path`` itself: its directory (the packaged names,
    ``embedded``, are directories too), its config, and the context it needs: a prompt
    and a response, within the model's positions."""
    directory = model_dir(cfg.model.path)
    config = ModelConfig.from_hf(json.loads((directory / "config.json").read_text()))
    wanted = cfg.model.max_prompt_tokens + cfg.model.max_new_tokens
    return directory, config, min(wanted, config.max_position_embeddings)


def start_sglang(cfg: RunConfig, index: int | None) -> tuple[EngineRunner, TextCodec, ModelConfig]:
    """An SGLang engine serving ``model.path`` (``backends.generate: sglang``), with its
    tokenizer and config. SGLang loads the Hugging Face directory itself, on the GPU this
    worker's index picks; the packaged names (``embedded``) are directories too."""
    from ..engines.sglang.engine import start_engine

    directory, config, context_length = _engine_model(cfg)
    torch.manual_seed(cfg.run.seed)
    runner = start_engine(
        str(directory),
        device=torch.device("cuda", (index or 0) % max(1, torch.cuda.device_count())),
        dtype=cfg.model.generator_dtype,
        context_length=context_length,
        seed=cfg.run.seed + (index or 0),
        version=0,
        bucket_mb=cfg.weights.consume_bucket_mb,
        tied_embeddings=config.tie_word_embeddings,
        mem_fraction=SGLANG_SHARED_MEM_FRACTION if cfg.backends.device == "cuda" else None,
    )
    return runner, TextCodec.from_dir(directory), config


def start_vllm(cfg: RunConfig, index: int | None) -> tuple[VLLMEngine, TextCodec, ModelConfig]:
    """A vLLM engine in this process serving ``model.path`` (``backends.generate: vllm``),
    with its tokenizer and config: on this process's share of the CPU, or on the GPU its
    index picks (``backends.device``). vLLM loads the Hugging Face directory itself. With
    ``model.lora`` it keeps that base and serves each version's adapters on it."""
    from ..engines.vllm.engine import LoraServing, start_engine

    directory, config, context_length = _engine_model(cfg)
    # Before the engine starts: vLLM's CPU worker keeps the threads it finds, and refuses
    # torch.set_num_threads afterwards.
    torch.set_num_threads(threads_for(cfg, "generate"))
    torch.manual_seed(cfg.run.seed)
    device = device_for(cfg, index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    engine = start_engine(
        str(directory),
        dtype=cfg.model.generator_dtype,
        context_length=context_length,
        seed=cfg.run.seed + (index or 0),
        version=0,
        kv_cache_gib=cfg.backends.vllm.kv_cache_gib,
        block_size=cfg.backends.vllm.block_size,
        tensor_parallel_size=cfg.backends.vllm.tensor_parallel_size,
        lora=LoraServing(lora.rank, lora.alpha) if (lora := cfg.model.lora).enabled else None,
    )
    return engine, TextCodec.from_dir(directory), config
