"""Rotary position embeddings as the supported families compute them: the inverse
frequencies (Llama 3.1's scaling and linear scaling included), and their rotation."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import ModelConfig, RopeScaling

__all__ = ["Rotary", "rotary_frequencies", "rotate"]


class Rotary(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rotary_frequencies(config), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        # The frequencies stay float32 whatever dtype the model is cast to, as transformers
        # keeps them: in bfloat16, position x frequency drifts by radians at long positions.
        # Only the device follows the model.
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin shaped [batch, 1, tokens, head_dim] for ``positions`` [batch, tokens]."""
        angles = positions.float()[..., None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        return angles.cos(), angles.sin()


def rotary_frequencies(config: ModelConfig) -> torch.Tensor:
    """Rotary inverse frequencies, with the same float32 operations as transformers, on
    the default device.

    Computed on the CPU and then moved: on the meta device (a model's skeleton,
    skeleton.py) these few operations would run torch's Python reference kernels, whose
    first use imports ``torch._dynamo`` (about a second)."""
    half = torch.arange(0, config.head_dim, 2, dtype=torch.float32, device="cpu") / config.head_dim
    inv_freq = 1.0 / (config.rope_theta**half)
    scaling = config.rope_scaling
    if scaling is not None:
        inv_freq = (
            inv_freq / scaling.factor
            if scaling.rope_type == "linear"
            else _llama3(inv_freq, scaling)
        )
    return inv_freq.to(torch.get_default_device())


def _llama3(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1's scaling: long wavelengths slowed by ``factor``, short ones kept, and
    those between blended smoothly (transformers' ``_compute_llama3_parameters``)."""
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-second, first), dim=-1) * sin.to(x.dtype)
