"""What logp and ref_logp share: score a lease's responses under a model, batch by batch."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from asyncrl.transport import protocol as p

from ._setup import load_policy
from .actor import Actor, Outcome, WorkerContext
from .payloads import LogprobsOut, RolloutsOut
from .policy.model import CausalLM
from .policy.scoring import pack, response_logprobs

__all__ = ["ScoringActor", "score_items", "tokens_of"]


class ScoringActor(Actor):
    """Log-probs of every response of a lease's groups, under this actor's model."""

    claim_size: ClassVar[int] = 4

    def on_start(self, ctx: WorkerContext) -> None:
        self.temperature = ctx.config.algorithm.temperature
        self.model, self.codec = load_policy(ctx.config, self.role, ctx.index)

    @property
    def version(self) -> int | None:
        """The policy version scored under (None: the frozen reference)."""
        return None

    def process(self, lease: p.Lease) -> Outcome:
        known = {item.gid: self.known_scores(RolloutsOut.of(item)) for item in lease.items}
        unknown = tuple(item for item in lease.items if known[item.gid] is None)
        if unknown:
            scored = score_items(self.model, unknown, self.codec.pad_id, self.temperature)
            known.update(zip((item.gid for item in unknown), scored, strict=True))
        results = tuple(
            p.Result(item.gid, LogprobsOut(known[item.gid], self.version).to_payload())
            for item in lease.items
        )
        return Outcome(results, tokens=tokens_of(lease))

    def known_scores(self, rollouts: RolloutsOut) -> np.ndarray | None:
        """What scoring ``rollouts`` would give, if known without running the model."""
        return None


def tokens_of(lease: p.Lease) -> int:
    """Response tokens in a lease's groups."""
    return sum(int(RolloutsOut.of(item).lengths.sum()) for item in lease.items)


@torch.inference_mode()
def score_items(
    model: CausalLM, items: tuple[p.Item, ...], pad_id: int, temperature: float
) -> list[np.ndarray]:
    """Per item, log-probs of its responses ``[n, longest]`` (float32; 0 past each end)."""
    rollouts = [RolloutsOut.of(item) for item in items]
    prompts, responses = [], []
    for group in rollouts:
        for response in group.responses():
            prompts.append(group.prompt_ids.tolist())
            responses.append(response)
    packed = pack(prompts, responses, pad_id)
    scores = response_logprobs(model.eval(), packed, temperature).cpu().numpy()
    out, row = [], 0
    for group in rollouts:
        n, width = group.response_ids.shape
        out.append(np.ascontiguousarray(scores[row : row + n, :width], dtype=np.float32))
        row += n
    return out
