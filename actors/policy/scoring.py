"""Log-probabilities of given responses under a model: what logp, ref_logp and train compute.

Sequences are packed right-padded, ``prompt + response`` per row; the result is laid out
per response token, ``[rows, longest response]``, with a mask for the real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..engines.contract import EngineModel, device_of
from .model import CausalLM, Entropy, Routing
from .sampling import PLAIN, Sampling

__all__ = [
    "Packed",
    "pack",
    "response_logprobs",
    "response_logprobs_and_entropy",
    "response_positions",
]


@dataclass(frozen=True)
class Packed:
    """Prompt+response rows, right-padded, and where each response sits in its row."""

    ids: torch.Tensor  # [rows, width] long
    starts: torch.Tensor  # [rows] index of each response's first token
    lengths: torch.Tensor  # [rows] response tokens per row
    mask: torch.Tensor  # [rows, longest response] 1.0 on response tokens that count
    # Router replay: the experts each token of ``ids`` goes through, [rows, width, layers,
    # per_token] (0 on padding); None: each token goes where the router sends it.
    routes: torch.Tensor | None = None

    def routing(
        self, device: torch.device, model: CausalLM | EngineModel | None = None
    ) -> Routing | None:
        """The routes of the tokens a model reads (every column but the last), laid out
        [layers, rows, tokens, per_token] as :class:`Routing` takes them; ValueError if
        they are not shaped for ``model``'s layers and experts."""
        if self.routes is None:
            return None
        experts = None if model is None else model.config.experts
        if model is not None:
            layers = model.config.num_hidden_layers
            if experts is None or tuple(self.routes.shape[2:]) != (layers, experts.per_token):
                per_token = "no" if experts is None else experts.per_token
                raise ValueError(
                    f"routes recorded for {self.routes.shape[2]} layers x "
                    f"{self.routes.shape[3]} experts a token; the model has {layers} layers "
                    f"x {per_token} (a generator of another model?)"
                )
        return Routing(self.routes[:, :-1].permute(2, 0, 1, 3).to(device, torch.long))


def pack(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    pad_id: int,
    trained: Sequence[Sequence[bool]] | None = None,
    routes: Sequence[torch.Tensor] | None = None,
) -> Packed:
    """``trained``: per response, which of its tokens count (the loss mask: observation
    and tool tokens of a multi-turn trajectory do not); None: every token. ``routes``:
    per row, the experts of its first tokens [tokens, layers, per_token] (router replay;
    at most prompt + response tokens)."""
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
    if trained is not None and len(trained) != len(responses):
        raise ValueError(f"{len(trained)} loss masks for {len(responses)} responses")
    if not prompts:
        raise ValueError("nothing to pack: no sequences")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    longest = max(len(r) for r in responses)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        ids[row, : len(prompt) + len(response)] = torch.tensor([*prompt, *response])
        if trained is None:
            mask[row, : len(response)] = 1.0
        else:
            counted = [bool(t) for t in trained[row][: len(response)]]
            mask[row, : len(response)] = torch.tensor(counted, dtype=torch.float32)
    starts = torch.tensor([len(p) for p in prompts])
    lengths = torch.tensor([len(r) for r in responses])
    return Packed(ids, starts, lengths, mask, _packed_routes(routes, len(prompts), width))


def _packed_routes(
    routes: Sequence[torch.Tensor] | None, rows: int, width: int
) -> torch.Tensor | None:
    if routes is None:
        return None
    if len(routes) != rows:
        raise ValueError(f"{len(routes)} route records for {rows} rows")
    out = torch.zeros(rows, width, *routes[0].shape[1:], dtype=routes[0].dtype)
    for row, record in enumerate(routes):
        if record.shape[1:] != out.shape[2:] or record.shape[0] > width:
            raise ValueError(
                f"row {row}: routes {tuple(record.shape)}; expected [<= {width}, "
                f"{', '.join(map(str, out.shape[2:]))}]"
            )
        out[row, : record.shape[0]] = record
    return out


def response_logprobs(
    model: CausalLM | EngineModel, packed: Packed, sampling: Sampling = PLAIN
) -> torch.Tensor:
    """log π(response token | everything before it), [rows, longest response]; 0 where the
    mask is (padding, and tokens the model did not sample).

    Under ``sampling`` (its temperature, min-p, top-k and top-p): the distribution the generator
    sampled from, so behaviour and recomputed log-probs compare like for like.
    """
    device = device_of(model)
    inputs, columns, tokens = response_positions(packed, device)
    if isinstance(model, EngineModel):  # the engine's own way (a split vocabulary, say)
        replay = _engine_routes(model, packed, device)
        picked = model.token_logprobs(inputs, columns, tokens, sampling, routes=replay)
        return picked * packed.mask.to(device)
    # Only the response positions, in fp32 whatever the weights' dtype, a chunk of the
    # vocabulary's logits at a time.
    routing = packed.routing(device, model)
    picked = model(inputs, columns=columns, targets=tokens, sampling=sampling, routing=routing)
    return picked * packed.mask.to(device)


def response_logprobs_and_entropy(
    model: CausalLM | EngineModel, packed: Packed, sampling: Sampling, entropy: Entropy
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`response_logprobs`, and the entropy of the distribution each response token
    was drawn from (``sampling``'s: temperature-scaled, truncated as the log-probs are),
    from the same logits in the same pass; both 0 off the mask. ``entropy``: "measured"
    (no gradient) or "trained"."""
    device = device_of(model)
    inputs, columns, tokens = response_positions(packed, device)
    if isinstance(model, EngineModel):
        replay = _engine_routes(model, packed, device)
        picked, spread = model.token_logprobs(inputs, columns, tokens, sampling, entropy, replay)
    else:
        picked, spread = model(
            inputs,
            columns=columns,
            targets=tokens,
            sampling=sampling,
            entropy=entropy,
            routing=packed.routing(device, model),
        )
    real = packed.mask.to(picked.device)
    return picked * real, torch.where(real > 0, spread, 0.0)


def _engine_routes(model: EngineModel, packed: Packed, device: torch.device) -> torch.Tensor | None:
    routing = packed.routing(device, model)
    return None if routing is None else routing.replay


def response_positions(
    packed: Packed, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a model is given to score ``packed``'s responses: the token ids it reads
    [rows, width - 1], the columns whose logits predict response tokens [rows, longest],
    and those tokens."""
    ids = packed.ids.to(device)
    targets = ids[:, 1:]
    # Response token j of a row sits at column start + j; its logits at start + j - 1.
    longest = packed.mask.shape[1]
    columns = (packed.starts.to(device)[:, None] - 1 + torch.arange(longest, device=device)).clamp(
        max=targets.shape[1] - 1
    )
    rows = torch.arange(ids.shape[0], device=device)[:, None]
    return ids[:, :-1], columns, targets[rows, columns]
