"""The trainer's side of LoRA: peft's adapters on the policy model, the base frozen.

peft wraps each adapted linear layer in place (``q_proj`` becomes a layer holding
``base_layer`` and ``lora_A``/``lora_B``), so the model keeps its code and names; only
the adapters require gradients. What leaves the trainer (a published version, a
checkpoint, ``final/adapter``) names the adapters as peft saves them for a Hugging Face
model of the same architecture, less peft's ``base_model.model.`` prefix
(adapters.py); our model's parameter names are transformers' own, so the saved names
load onto ``AutoModelForCausalLM`` unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from asyncrl.runtime.contract.config import LoraSection

from .adapters import adapted_modules, merged_weight
from .checkpoint import read_weights, write_directory, write_extra, write_model_files
from .model import CausalLM, ModelConfig

__all__ = [
    "ADAPTER_WEIGHTS",
    "FINAL_ADAPTER",
    "PEFT_MISSING",
    "add_adapters",
    "is_adapter",
    "merged_state",
    "published_name",
    "read_adapters",
    "save_adapter_checkpoint",
    "save_adapter_dir",
    "save_final",
    "trainer_name",
]

ADAPTER_WEIGHTS = "adapter_model.safetensors"
FINAL_ADAPTER = "adapter"  # final/adapter: the peft directory beside the merged model
PEFT_MISSING = "model.lora.rank > 0 needs peft, which is not installed: pip install 'asyncrl[lora]'"
_SAVED_PREFIX = "base_model.model."  # what PeftModel's own save puts before each name
_ADAPTER = "default"  # the one adapter, under peft's default name


def _lora_config(spec: LoraSection, base: str = ""):
    try:
        from peft import LoraConfig
    except ImportError as error:
        raise RuntimeError(PEFT_MISSING) from error
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        base_model_name_or_path=base or None,
        task_type="CAUSAL_LM",
    )


def add_adapters(model: CausalLM, spec: LoraSection) -> list[str]:
    """Give ``model`` fresh adapters (B = 0: the base's outputs, unchanged) and freeze the
    rest; the adapted layers' names. A target that picks no layer is a ValueError."""
    modules = adapted_modules(model, spec.target_modules)
    config = _lora_config(spec)  # first: says how to install peft if it is missing
    from peft import inject_adapter_in_model

    inject_adapter_in_model(config, model, adapter_name=_ADAPTER)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name))
    return modules


def is_adapter(name: str) -> bool:
    """Whether a parameter of a model with adapters (or a published name) is an adapter's."""
    return ".lora_A." in name or ".lora_B." in name


def published_name(name: str) -> str:
    """``…q_proj.lora_A.default.weight`` (the trainer's parameter) → ``…q_proj.lora_A.weight``."""
    return name.replace(f".{_ADAPTER}.", ".")


def trainer_name(name: str) -> str:
    """The inverse of :func:`published_name`."""
    for part in ("lora_A", "lora_B"):
        name = name.replace(f".{part}.weight", f".{part}.{_ADAPTER}.weight")
    return name


def merged_state(
    base: Mapping[str, torch.Tensor],
    adapters: Mapping[str, torch.Tensor],
    scale: float,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """The base weights (by Hugging Face name, a model directory's) with ``adapters``
    (published names) merged in, in ``dtype``: a plain model of the base's architecture.
    The base is the one every rank trained on (frozen), so no group gathers it."""
    state = {}
    for name, weight in base.items():
        module = name.removesuffix(".weight")
        a = adapters.get(f"{module}.lora_A.weight")
        if a is None:
            state[name] = weight.to(dtype)
        else:
            b = adapters[f"{module}.lora_B.weight"]
            state[name] = merged_weight(weight, a, b, scale).to(dtype)
    return state


def save_adapter_dir(
    spec: LoraSection, adapters: Mapping[str, torch.Tensor], base: str, target: Path
) -> None:
    """``adapters`` (published names) as a peft adapter directory at ``target``:
    ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), target)``."""
    target.mkdir(parents=True, exist_ok=True)
    tensors = {_SAVED_PREFIX + name: t.contiguous() for name, t in adapters.items()}
    save_file(tensors, str(target / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    _lora_config(spec, base).save_pretrained(str(target))


def read_adapters(directory: Path) -> dict[str, torch.Tensor]:
    """A peft adapter directory's tensors, by published name."""
    tensors = load_file(str(directory / ADAPTER_WEIGHTS))
    return {name.removeprefix(_SAVED_PREFIX): t for name, t in tensors.items()}


def save_adapter_checkpoint(
    spec: LoraSection,
    adapters: Mapping[str, torch.Tensor],
    source: Path,
    target: Path,
    extra: dict | None = None,
) -> None:
    """A LoRA run's checkpoint: a peft adapter directory (on the base at ``source``) with
    ``extra`` files beside it (optimizer, counters), appearing whole or not at all."""

    def fill(staging: Path) -> None:
        save_adapter_dir(spec, adapters, str(source), staging)
        write_extra(staging, extra)

    write_directory(target, fill)


def save_final(
    config: ModelConfig,
    spec: LoraSection,
    adapters: Mapping[str, torch.Tensor],
    source: Path,
    target: Path,
    dtype: torch.dtype,
) -> None:
    """A LoRA run's ``final/``: the merged model (a Hugging Face directory that
    transformers loads alone) with the peft adapter directory in ``final/adapter``."""
    merged = merged_state(read_weights(source), adapters, spec.scale, dtype)

    def fill(staging: Path) -> None:
        write_model_files(config, merged, source, staging)
        save_adapter_dir(spec, adapters, str(source), staging / FINAL_ADAPTER)

    write_directory(target, fill)
