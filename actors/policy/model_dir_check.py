"""Check a model directory before any worker loads it: one line saying what is wrong.

:func:`check_model_dir` reads config.json, the safetensors headers (never the tensors)
and tokenizer.json, and compares them with what :class:`CausalLM` would build, so a run
with an unusable ``model.path`` stops at its start with the reason, not minutes later in
a worker with a stack trace. The model is built as a skeleton: shapes, no memory.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import SafetensorError, safe_open

from .checkpoint import is_weight, packaged_or_path, weight_files
from .config import SUPPORTED_ARCHITECTURES, ModelConfig
from .skeleton import skeleton
from .tokenizer import TextCodec

__all__ = ["ModelDirError", "check_model_dir"]


class ModelDirError(ValueError):
    """A model directory this runtime cannot use; the message is one line naming why."""


def check_model_dir(path: str) -> None:
    """Raise :class:`ModelDirError` if ``path`` (a directory, or a packaged model's name) is not a
    model this runtime can load: its config, weights' names and shapes, and tokenizer."""
    directory = packaged_or_path(path)
    try:
        config = _config(directory)
        _check_weights(directory, config)
        _check_tokenizer(directory, config)
    except ModelDirError as error:
        raise ModelDirError(f"model.path={path!r}: {error}") from None
    except (OSError, ValueError) as error:  # from the readers: already names the problem
        text = " ".join(str(error).split())  # one line, whatever the reader wrote
        raise ModelDirError(f"model.path={path!r}: {text}") from error


def _config(directory: Path) -> ModelConfig:
    if not directory.is_dir():
        raise ModelDirError("no such directory")
    path = directory / "config.json"
    if not path.is_file():
        supported = ", ".join(SUPPORTED_ARCHITECTURES)
        raise ModelDirError(
            f"no config.json in the directory (expected a Hugging Face model directory of "
            f"{supported})"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ModelDirError(f"config.json is not JSON: {error}") from None
    return ModelConfig.from_hf(raw)


def _check_weights(directory: Path, config: ModelConfig) -> None:
    expected = _expected_shapes(config)
    stored = _stored_shapes(directory)
    if config.tie_word_embeddings:
        stored.pop("lm_head.weight", None)  # a tied head may be stored too; it is not read
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    arch = config.architecture
    if missing:
        raise ModelDirError(
            f"the weights lack {len(missing)} tensors that config.json's {arch} has, "
            f"e.g. {missing[:3]}"
        )
    if unexpected:
        raise ModelDirError(
            f"the weights hold {len(unexpected)} tensors that config.json's {arch} has no "
            f"place for, e.g. {unexpected[:3]}"
        )
    for name, shape in expected.items():
        if stored[name] != shape:
            raise ModelDirError(
                f"weight {name} is {list(stored[name])} but config.json's {arch} needs "
                f"{list(shape)}"
            )


def _expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    model = skeleton(config)
    # named_parameters names a tied lm_head once, as the embedding: what a checkpoint holds.
    return {name: tuple(param.shape) for name, param in model.named_parameters()}


def _stored_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    try:
        files = weight_files(directory)
    except FileNotFoundError as error:
        raise ModelDirError(f"{error} (safetensors weights are required)") from None
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            shapes |= _header_shapes(path)
        except (SafetensorError, OSError) as error:
            raise ModelDirError(
                f"{path.name} is not a readable safetensors file: {error}"
            ) from None
    return shapes


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), framework="pt") as handle:  # reads the header only
        return {
            name: tuple(handle.get_slice(name).get_shape())
            for name in handle.keys()  # noqa: SIM118 - a safetensors handle, not a dict
            if is_weight(name)
        }


def _check_tokenizer(directory: Path, config: ModelConfig) -> None:
    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ModelDirError(
            "no tokenizer.json in the directory (the tokenizers library's file is the "
            "supported format)"
        )
    try:
        codec = TextCodec.from_dir(directory)
    except (OSError, ValueError):
        raise  # already names the file and the problem
    except Exception as error:  # the tokenizers library raises a bare Exception
        raise ModelDirError(f"tokenizer.json does not load: {error}") from None
    largest = max(codec.tokenizer.get_vocab(with_added_tokens=True).values())
    if largest >= config.vocab_size:
        raise ModelDirError(
            f"tokenizer.json has token id {largest} but config.json vocab_size="
            f"{config.vocab_size}: the embedding holds ids below {config.vocab_size} only"
        )
    for token_id in (*codec.eos_ids, codec.pad_id):
        if not 0 <= token_id < config.vocab_size:
            raise ModelDirError(
                f"special token id {token_id} (eos or pad) is outside config.json "
                f"vocab_size={config.vocab_size}"
            )
