"""The critic's model: the policy's decoder stack with a scalar value head.

Any family the policy runs in (actors/policy/model.py) gives a critic, started from a
model directory (``critic.path``, by default the policy's): its decoder weights are
taken as they are, its output layer is left out, and the value head, ``score``, starts
at zero (every value 0: the first advantages are the plain returns) unless the directory
is a critic's own. The names are those of Hugging Face's ``*ForTokenClassification`` with
one label (``model.*`` and ``score.*``), so a critic checkpoint loads there too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import torch
from torch import nn

from ..engines.contract import device_of
from ..policy.checkpoint import model_dir, read_weights
from ..policy.model import Decoder, ModelConfig
from ..policy.scoring import Packed, response_positions
from ..policy.tokenizer import TextCodec

__all__ = [
    "ValueModel",
    "freeze_lower_layers",
    "frozen_layers_problem",
    "layers_problem",
    "load_value_model",
    "load_value_weights",
    "response_values",
]

HEAD = "score."  # the value head's parameters' prefix


class ValueModel(Decoder):
    """Token ids in, one value per position out."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.score = nn.Linear(config.hidden_size, 1)
        nn.init.zeros_(self.score.weight)
        nn.init.zeros_(self.score.bias)

    def forward(self, input_ids: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """float32 values [batch, tokens] (or [batch, k] at ``columns``)."""
        return self.score(self.hidden(input_ids, columns)).squeeze(-1).float()


def frozen_layers_problem(frozen: int, layers: int) -> str | None:
    """Why ``critic.frozen_layers`` cannot be ``frozen`` for a critic of ``layers``
    decoder layers, or None."""
    if 0 <= frozen < layers:
        return None
    return (
        f"critic.frozen_layers={frozen}: the critic has {layers} decoder layers, "
        f"so at most {layers - 1} can be frozen (one must learn)"
    )


def freeze_lower_layers(model: ValueModel, layers: int) -> None:
    """Keep the embeddings and the lowest ``layers`` decoder layers as loaded
    (``critic.frozen_layers``): the update's backward stops above them, and the optimizer
    keeps no state for them. Their features stay the starting model's (the policy's, by
    default); the layers above them and the value head learn."""
    problem = frozen_layers_problem(layers, len(model.model.layers))
    if problem is not None:
        raise ValueError(problem)
    if layers == 0:
        return
    for module in (model.model.embed_tokens, *model.model.layers[:layers]):
        module.requires_grad_(False)


def response_values(model: ValueModel, packed: Packed) -> torch.Tensor:
    """The value of the state before each response token, ``[rows, longest response]``
    (where that token's log-prob is read), 0 off the mask (padding, observation tokens)."""
    device = device_of(model)
    inputs, columns, _ = response_positions(packed, device)
    return model(inputs, columns) * packed.mask.to(device)


def layers_problem(layers: int, available: int) -> str | None:
    """Why ``critic.layers`` cannot be ``layers`` for a directory of ``available`` decoder
    layers, or None."""
    if layers <= available:
        return None
    return (
        f"critic.layers={layers}: the critic's directory has {available} decoder layers; "
        f"allowed: 1 to {available}, or 0 for all of them"
    )


def load_value_model(
    path: str,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
    layers: int = 0,
) -> tuple[ValueModel, TextCodec]:
    """The critic from model directory ``path`` (or ``embedded``), and its tokenizer; in
    ``dtype`` on ``device`` (a GPU becomes this process's current one). ``layers`` > 0
    keeps the directory's lowest ``layers`` decoder layers (``critic.layers``): the
    layers above them are not built, and their weights not read into the critic."""
    directory = model_dir(path)
    config = ModelConfig.from_hf(json.loads((directory / "config.json").read_text()))
    if layers:
        problem = layers_problem(layers, config.num_hidden_layers)
        if problem is not None:
            raise ValueError(problem)
        config = config.lowest_layers(layers)
    model = ValueModel(config)
    stored = read_weights(directory)
    own = any(name.startswith(HEAD) for name in stored)  # a critic's own checkpoint
    load_value_weights(model, stored, head=own, source=str(directory))
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)
    return model.to(device=device, dtype=dtype), TextCodec.from_dir(directory)


def load_value_weights(
    model: ValueModel,
    stored: Mapping[str, torch.Tensor],
    *,
    head: bool = True,
    source: str = "the weights",
) -> None:
    """``stored`` (by Hugging Face name) into ``model``: every parameter, or with ``head``
    False the decoder's alone (a policy's directory, which has no value head)."""
    params = dict(model.named_parameters())
    wanted = {n for n in params if head or not n.startswith(HEAD)}
    missing = sorted(wanted - set(stored))
    if missing:
        raise ValueError(f"{source}: no weights for the critic's {missing[:5]}")
    with torch.no_grad():
        for name in wanted:
            params[name].copy_(stored[name])
