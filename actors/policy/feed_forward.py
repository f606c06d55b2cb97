"""A decoder layer's feed-forward part: the gated MLP, or a mixture of such experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig

__all__ = ["MLP", "MixtureOfExperts", "Routing"]


class Routing:
    """What a forward pass does with the routers of a mixture of experts: ``replay``
    [layers, batch, tokens, per_token] routes each token through those experts instead of
    its router's top-k (router replay); ``record`` keeps each layer's choice, [batch,
    tokens, per_token] per layer in order (the generator's). Layer i of the model reads
    and writes entry i; a model without experts never asks."""

    def __init__(self, replay: torch.Tensor | None = None, *, record: bool = False) -> None:
        self.replay = replay
        self.recorded: list[torch.Tensor] | None = [] if record else None

    def layer(self, index: int) -> torch.Tensor | None:
        return None if self.replay is None else self.replay[index]


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

    def forward(
        self,
        x: torch.Tensor,
        replay: torch.Tensor | None = None,
        recorded: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``replay`` [*x's leading dims, per_token]: the experts each token goes through
        (recorded by the generator), weighted by this router's probabilities of them; the
        router's own choice otherwise. ``recorded``: the choice is appended to it, shaped
        like ``replay``."""
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = self.gate(tokens)
        # The softmax in float32 and the chosen weights back in the activations' dtype, as
        # transformers computes them: the trainer's log-probs match the checkpoint's own.
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        if replay is None:
            weights, chosen = torch.topk(probs, self.spec.per_token, dim=-1)
        else:
            # The recorded experts, their weights from this router's softmax: the gate's
            # gradient flows through them, so the router keeps learning.
            chosen = replay.reshape(-1, self.spec.per_token).to(torch.long)
            weights = probs.gather(-1, chosen)
        if recorded is not None:
            recorded.append(chosen.reshape(*shape[:-1], self.spec.per_token))
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
