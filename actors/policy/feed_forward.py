"""A decoder layer's feed-forward part: the gated MLP, or a mixture of such experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig

__all__ = ["MLP", "MixtureOfExperts"]


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, inner: int | None = None) -> None:
        super().__init__()
        hidden, bias = config.hidden_size, config.mlp_bias
        inner = inner or config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=bias)
        self.up_proj = nn.Linear(hidden, inner, bias=bias)
        self.down_proj = nn.Linear(inner, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtureOfExperts(nn.Module):
    """A mixture of experts (:class:`~.config.Experts`) in place of the MLP: each token goes
    to its ``per_token`` best-scored experts, their outputs summed by the router's weights.
    Every expert computes only the tokens routed to it."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.experts is not None
        self.spec = config.experts
        self.gate = nn.Linear(config.hidden_size, self.spec.count, bias=False)
        self.experts = nn.ModuleList(
            MLP(config, self.spec.intermediate_size) for _ in range(self.spec.count)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = self.gate(tokens)
        # The softmax in float32 and the chosen weights back in the activations' dtype, as
        # transformers computes them: the trainer's log-probs match the checkpoint's own.
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.spec.per_token, dim=-1)
        if self.spec.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(logits.dtype)
        out = torch.zeros_like(tokens)
        # One host sync per layer for the experts that got tokens: an expert nobody chose
        # costs nothing.
        for e in torch.unique(chosen).tolist():
            token, slot = torch.where(chosen == e)
            y = self.experts[e](tokens[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out.reshape(shape)
