"""Model directories in Hugging Face format: config.json, model.safetensors, tokenizer.json.

Weights are one ``model.safetensors`` or shards listed by ``model.safetensors.index.json``.

``embedded`` names the base model shipped inside this package (made by
``python -m tests.tools.warmup``); any other value is a directory path.
Writes go to a temporary directory swapped into place by one rename, so a crash never
leaves half a checkpoint under the final name, nor none where there was one
(runtime/contract/whole_dirs.py). A written directory is its user's only (0700, files 0600).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import structlog
import torch
from safetensors.torch import load_file, save_file

from asyncrl.runtime.contract.whole_dirs import (
    remove_leftovers,
    replace_directory,
    restore_parked,
    temporary_beside,
)

from .directories import EMBEDDED, EMBEDDED_DIR, PACKAGED, model_dir, packaged_or_path
from .model import CausalLM, ModelConfig
from .tokenizer import TextCodec

__all__ = [
    "EMBEDDED",
    "EMBEDDED_DIR",
    "PACKAGED",
    "is_weight",
    "load_model",
    "load_parameters",
    "load_state",
    "model_dir",
    "packaged_or_path",
    "read_weights",
    "save_model",
    "save_state",
    "state_for_saving",
    "weight_files",
    "write_directory",
    "write_extra",
    "write_model_files",
]

log = structlog.get_logger("asyncrl.checkpoint")

# Copied from the base model into every checkpoint: what encodes text and says when a
# response ends (generation_config.json may list several end-of-sequence ids).
_COPIED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
)
# Buffers that some older checkpoints saved beside the parameters; recomputed, not loaded
# (transformers skips them too).
_NOT_WEIGHTS = ("rotary_emb.inv_freq",)


def load_model(path: str, dtype: torch.dtype = torch.float32) -> tuple[CausalLM, TextCodec]:
    """The model and its tokenizer from ``path`` (a directory, or ``embedded``)."""
    directory = model_dir(path)
    config = ModelConfig.from_hf(json.loads((directory / "config.json").read_text()))
    model = CausalLM(config)
    load_state(model, read_weights(directory))
    return model.to(dtype), TextCodec.from_dir(directory)


def load_state(
    model: CausalLM, state: Mapping[str, torch.Tensor], *, copy: bool = True
) -> list[torch.Tensor]:
    """Put ``state`` into ``model``; a missing or unexpected tensor is an error naming it.

    ``copy=False`` makes the model run on ``state``'s tensors themselves (a weight
    receiver's checked buffer), which then must not change while the model uses them, and
    returns the tensors the model ran on before (for the caller to free where it suits).

    On a model whose versions are adapters (``model.adapters``), ``state`` is a version's
    adapters, merged onto the base weights (always a copy).
    """
    if model.adapters is not None:  # a LoRA run's version: merged, nothing superseded
        model.adapters.apply(model, state)
        return []
    tied: tuple[str, ...] = ()
    if model.config.tie_word_embeddings:
        state = {name: t for name, t in state.items() if name != "lm_head.weight"}
        tied = ("lm_head.weight",)  # stored once, as state_for_saving does
    return load_parameters(model, state, copy=copy, tied=tied)


def load_parameters(
    module: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    copy: bool = True,
    tied: Collection[str] = (),
) -> list[torch.Tensor]:
    """Put ``state`` into ``module``'s parameters by name (any model: the policy's, the
    critic's); ``tied`` parameters are another's and absent from ``state``. A missing or
    unexpected tensor is an error naming it; ``copy`` is :func:`load_state`'s."""
    # One walk over the modules: a generator switches versions between decode steps.
    params = dict(module.named_parameters())
    expected = set(params).difference(tied)
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ValueError(
            f"weights do not fit the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    for name, tensor in state.items():
        param = params[name]
        if tensor.shape != param.shape:  # a copy would broadcast some shapes silently
            raise ValueError(
                f"weight {name!r} is {tuple(tensor.shape)} {tensor.dtype}; the model's is "
                f"{tuple(param.shape)} {param.dtype}"
            )
    if not copy and any(param.device.type != "cpu" for param in params.values()):
        copy = True  # CPU buffers cannot be a GPU model's weights: copy them over
    if not copy and any(state[name].dtype != params[name].dtype for name in state):
        copy = True  # a model in another precision than the weights (model.generate_dtype)
    superseded: list[torch.Tensor] = []
    with torch.no_grad():
        for name, tensor in state.items():
            if copy:
                params[name].copy_(tensor)
            else:
                superseded.append(params[name].data)
                params[name].data = tensor
    return superseded


def state_for_saving(model: CausalLM) -> dict[str, torch.Tensor]:
    """Parameters by Hugging Face name; a tied output layer is stored once, as HF does."""
    state = {name: p.detach() for name, p in model.named_parameters()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def save_model(model: CausalLM, source: Path, target: Path, extra: dict | None = None) -> None:
    """Write ``model`` as a Hugging Face directory at ``target``, with ``source``'s tokenizer.

    ``extra`` files (name → bytes) land beside the weights (optimizer state, counters).
    """
    save_state(model.config, state_for_saving(model), source, target, extra)


def save_state(
    config: ModelConfig,
    state: Mapping[str, torch.Tensor],
    source: Path,
    target: Path,
    extra: dict | None = None,
) -> None:
    """:func:`save_model` for weights held apart from a model (gathered from a group)."""
    write_directory(
        target, lambda staging: write_model_files(config, state, source, staging, extra)
    )


def write_model_files(
    config: ModelConfig,
    state: Mapping[str, torch.Tensor],
    source: Path,
    directory: Path,
    extra: dict | None = None,
) -> None:
    """A Hugging Face model's files into ``directory``: weights, config, ``source``'s
    tokenizer, and ``extra`` files (name → bytes)."""
    tensors = {name: t.contiguous() for name, t in state.items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    dtype = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    hf_config = config.to_hf() | _token_ids(source) | {"torch_dtype": dtype}
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    for name in _COPIED_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, directory / name)
    write_extra(directory, extra)


def write_extra(directory: Path, extra: dict | None) -> None:
    for name, data in (extra or {}).items():
        (directory / name).write_bytes(data)


def write_directory(target: Path, fill: Callable[[Path], None]) -> None:
    """Make the directory ``target`` whole or not at all: ``fill`` writes a temporary
    directory beside it, which then replaces ``target`` (the old one or the new one is
    there at every moment)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    restore_parked(target)
    stale = remove_leftovers(target.parent)  # what writers killed here before left
    if stale:
        log.info("removed what killed writers left", directory=str(target.parent), dirs=stale)
    staging = temporary_beside(target)
    try:
        fill(staging)
        _fsync_dir(staging)
        _private(staging)
        replace_directory(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory: ``model.safetensors``, or the shards
    that ``model.safetensors.index.json`` names (each once)."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        raise FileNotFoundError(f"{directory}: no model.safetensors (or its index)")
    weight_map = json.loads(index.read_text()).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{index}: no weight_map naming the shards")
    shards = sorted(set(weight_map.values()))
    missing = [name for name in shards if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{index}: names shards that are not there: {missing[:3]}")
    return [directory / name for name in shards]


def is_weight(name: str) -> bool:
    """Whether a stored tensor is a parameter (not a buffer older checkpoints kept)."""
    return not name.endswith(_NOT_WEIGHTS)


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every parameter a model directory stores, by name."""
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(directory):
        state.update((k, t) for k, t in load_file(str(path)).items() if is_weight(k))
    return state


def _token_ids(source: Path) -> dict:
    config = json.loads((source / "config.json").read_text())
    return {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}


def _private(directory: Path) -> None:
    """Close what the libraries wrote to others, whatever the umask: a checkpoint is the
    run's, as the rest of its directory (a temporary directory starts 0700). Never opens a
    file wider than it was made."""
    for path in directory.iterdir():
        if path.is_dir():  # final/adapter beside a LoRA run's merged model
            path.chmod(stat.S_IMODE(path.stat().st_mode) & 0o700)
            _private(path)
        else:
            path.chmod(stat.S_IMODE(path.stat().st_mode) & 0o600)


def _fsync_dir(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_dir():
            _fsync_dir(path)
            continue
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
