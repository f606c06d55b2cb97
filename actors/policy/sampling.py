"""The distribution a token is drawn from, given a model's logits: one definition for the
decoder that samples and the scorers that recompute log-probs, so the two cannot differ.

The logits are divided by the temperature. Then top-k keeps the tokens whose logit is at
least the k-th largest (a tie at the k-th is kept whole, as vLLM does, so the set does not
depend on how a sort orders equal values). Then top-p, over what top-k kept,
renormalized, keeps the smallest set of most likely tokens whose probability reaches
top_p: sorted most likely first, token i is kept while the mass of tokens 0..i-1 is
below top_p, so the token that reaches top_p is in, and always at least one; every token
as likely as the least likely one kept is in too (ties whole, again). The log-probs are
of what is kept, renormalized; the rest get -inf. vLLM applies top-k, then top-p, in the
same order, and reports these log-probs as ``logprobs_mode="processed_logprobs"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from asyncrl.runtime.contract.config import AlgorithmSection

__all__ = ["PLAIN", "Sampling", "sampled_logprobs", "sampling_problem"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """How tokens are drawn from a model's logits: the run's ``algorithm.temperature``,
    ``algorithm.top_p`` and ``algorithm.top_k``, which the scorers recompute under."""

    temperature: float = 1.0
    top_p: float = 1.0  # 1: the whole distribution
    top_k: int = 0  # 0: every token

    def __post_init__(self) -> None:
        problem = sampling_problem(self.temperature, self.top_p, self.top_k)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def of(cls, algorithm: AlgorithmSection) -> Sampling:
        """The run's sampling (``algorithm.temperature``, ``top_p``, ``top_k``)."""
        return cls(algorithm.temperature, algorithm.top_p, algorithm.top_k)

    @property
    def truncates(self) -> bool:
        """Whether some tokens may be left out (top-k or top-p)."""
        return self.top_k > 0 or self.top_p < 1.0

    def logprobs(self, logits: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`sampled_logprobs` of ``logits`` under this sampling."""
        return sampled_logprobs(logits, self.temperature, self.top_p, self.top_k, keep)


def sampling_problem(temperature: object, top_p: object, top_k: object) -> str | None:
    """What is wrong with these sampling settings, naming the field; None if nothing."""
    if not _number(temperature) or not temperature > 0:  # type: ignore[operator]
        return f"temperature={temperature!r}: expected a number > 0"
    if not _number(top_p) or not 0 < top_p <= 1:  # type: ignore[operator]
        return f"top_p={top_p!r}: expected a number in (0, 1] (1: the whole distribution)"
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        return f"top_k={top_k!r}: expected an integer >= 0 (0: every token)"
    return None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


PLAIN = Sampling()  # temperature 1, the whole distribution: the model's own


Scalar = float | torch.Tensor  # one value for every row, or one per row ([rows])


def sampled_logprobs(
    logits: torch.Tensor,
    temperature: Scalar = 1.0,
    top_p: Scalar = 1.0,
    top_k: int | torch.Tensor = 0,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float32 log-probs [..., vocab] of the distribution sampled from ``logits`` [...,
    vocab] (see the module's docstring); -inf for the tokens truncation leaves out.

    ``temperature``, ``top_p`` and ``top_k`` are one value, or one per row of a 2-D
    ``logits`` ([rows]). ``keep`` [...]: a token id per row that is kept whatever the
    truncation says (the token that was sampled: a scorer's logits differ from the
    sampler's in the last bits, and a token at the very edge of the kept set must not
    score -inf). Truncation is decided without gradients; the log-probs have them.
    """
    scaled = logits.float()
    if isinstance(temperature, torch.Tensor):
        scaled = scaled / temperature.to(scaled.device, torch.float32)[:, None]
    elif temperature != 1.0:
        scaled = scaled / temperature
    if not _truncates(top_p, top_k):
        return torch.log_softmax(scaled, dim=-1)
    with torch.no_grad():
        dropped = ~_kept(scaled.detach(), top_p, top_k)
        if keep is not None:
            dropped.scatter_(-1, keep.unsqueeze(-1), False)
    return torch.log_softmax(scaled.masked_fill(dropped, float("-inf")), dim=-1)


def _truncates(top_p: Scalar, top_k: int | torch.Tensor) -> bool:
    if isinstance(top_k, torch.Tensor) or isinstance(top_p, torch.Tensor):
        return True
    return top_k > 0 or top_p < 1.0


def _kept(scaled: torch.Tensor, top_p: Scalar, top_k: int | torch.Tensor) -> torch.Tensor:
    """Which tokens top-k, then top-p keep: bool, shaped like ``scaled``."""
    vocab = scaled.shape[-1]
    kept = torch.ones_like(scaled, dtype=torch.bool)
    per_row_k = isinstance(top_k, torch.Tensor)
    if per_row_k or 0 < top_k < vocab:
        k = top_k.to(scaled.device)[:, None] if per_row_k else torch.tensor(top_k)
        k = torch.where(k > 0, k, vocab).clamp(max=vocab)  # 0: every token
        largest = scaled.topk(int(k.max()), dim=-1).values
        kth = largest.gather(-1, (k - 1).expand(*largest.shape[:-1], 1))
        kept = scaled >= kth
    per_row_p = isinstance(top_p, torch.Tensor)
    if per_row_p or top_p < 1.0:
        probs = torch.softmax(scaled.masked_fill(~kept, float("-inf")), dim=-1)
        ordered = probs.sort(dim=-1, descending=True).values
        # The mass of the tokens before each, most likely first (0 before the first).
        before = F.pad(ordered.cumsum(dim=-1)[..., :-1], (1, 0))
        p = top_p.to(scaled.device, torch.float32)[:, None] if per_row_p else top_p
        count = (before < p).sum(dim=-1, keepdim=True)
        # A row at top_p = 1 keeps everything, whatever the rounding of its sums.
        whole = p >= 1.0 if per_row_p else torch.tensor(False)
        count = torch.where(whole, vocab, count)
        least = ordered.gather(-1, count - 1)
        kept = kept & (probs >= least)
    return kept
