"""The distribution a token is drawn from, given a model's logits: one definition for the
decoder that samples and the scorers that recompute log-probs, so the two cannot differ.

In vLLM's order (its v1 ``Sampler``: the temperature, then the argmax-invariant logits
processors, min-p among them, then top-k and top-p together):

1. The logits are divided by the temperature.
2. min-p drops the tokens whose probability, under the tempered softmax of every token,
   is below min_p times the most likely token's (computed as probabilities, as vLLM
   does, so that a token at the very edge falls the same side; every token as likely as
   the most likely one is kept).
3. top-k keeps, of what min-p kept, the tokens whose logit is at least the k-th largest
   (a tie at the k-th is kept whole, as vLLM does, so the set does not depend on how a
   sort orders equal values; fewer than k left: all of them).
4. top-p, over what min-p and top-k kept, renormalized, keeps the smallest set of most
   likely tokens whose probability reaches top_p: sorted most likely first, token i is
   kept while the mass of tokens 0..i-1 is below top_p, so the token that reaches top_p
   is in, and always at least one; every token as likely as the least likely one kept is
   in too (ties whole, again).

The log-probs are of what is kept, renormalized; the rest get -inf. vLLM reports the
same log-probs as ``logprobs_mode="processed_logprobs"``: the log-softmax of the logits
after all four steps, the min-p mask included. min-p and top-k commute (both keep the
most likely tokens); top-p after min-p does not equal top-p before it, so an engine that
orders them otherwise samples, with both set, from a slightly different set than the
scorers recompute.
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
    ``top_p``, ``top_k`` and ``min_p``, which the scorers recompute under."""

    temperature: float = 1.0
    top_p: float = 1.0  # 1: the whole distribution
    top_k: int = 0  # 0: every token
    min_p: float = 0.0  # 0: off

    def __post_init__(self) -> None:
        problem = sampling_problem(self.temperature, self.top_p, self.top_k, self.min_p)
        if problem is not None:
            raise ValueError(problem)

    @classmethod
    def of(cls, algorithm: AlgorithmSection) -> Sampling:
        """The run's sampling (``algorithm.temperature``, ``top_p``, ``top_k``, ``min_p``)."""
        return cls(algorithm.temperature, algorithm.top_p, algorithm.top_k, algorithm.min_p)

    @property
    def truncates(self) -> bool:
        """Whether some tokens may be left out (min-p, top-k or top-p)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    def logprobs(self, logits: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`sampled_logprobs` of ``logits`` under this sampling."""
        return sampled_logprobs(
            logits, self.temperature, self.top_p, self.top_k, keep, min_p=self.min_p
        )


def sampling_problem(
    temperature: object, top_p: object, top_k: object, min_p: object = 0.0
) -> str | None:
    """What is wrong with these sampling settings, naming the field; None if nothing."""
    if not _number(temperature) or not temperature > 0:  # type: ignore[operator]
        return f"temperature={temperature!r}: expected a number > 0"
    if not _number(top_p) or not 0 < top_p <= 1:  # type: ignore[operator]
        return f"top_p={top_p!r}: expected a number in (0, 1] (1: the whole distribution)"
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        return f"top_k={top_k!r}: expected an integer >= 0 (0: every token)"
    # At 1 only the most likely token is left: greedy, which a request asks for as such.
    if not _number(min_p) or not 0 <= min_p < 1:  # type: ignore[operator]
        return f"min_p={min_p!r}: expected a number in [0, 1) (0: off)"
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
    *,
    min_p: Scalar = 0.0,
) -> torch.Tensor:
    """Float32 log-probs [..., vocab] of the distribution sampled from ``logits`` [...,
    vocab] (see the module's docstring); -inf for the tokens truncation leaves out.

    ``temperature``, ``top_p``, ``top_k`` and ``min_p`` are one value, or one per row of a 2-D
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
    if not _truncates(top_p, top_k, min_p):
        return torch.log_softmax(scaled, dim=-1)
    with torch.no_grad():
        dropped = ~_kept(scaled.detach(), top_p, top_k, min_p)
        if keep is not None:
            dropped.scatter_(-1, keep.unsqueeze(-1), False)
    return torch.log_softmax(scaled.masked_fill(dropped, float("-inf")), dim=-1)


def _truncates(top_p: Scalar, top_k: int | torch.Tensor, min_p: Scalar) -> bool:
    if any(isinstance(value, torch.Tensor) for value in (top_p, top_k, min_p)):
        return True
    return top_k > 0 or top_p < 1.0 or min_p > 0.0


def _kept(
    scaled: torch.Tensor, top_p: Scalar, top_k: int | torch.Tensor, min_p: Scalar
) -> torch.Tensor:
    """Which tokens min-p, then top-k, then top-p keep: bool, shaped like ``scaled``."""
    vocab = scaled.shape[-1]
    kept = torch.ones_like(scaled, dtype=torch.bool)
    per_row_min_p = isinstance(min_p, torch.Tensor)
    if per_row_min_p or min_p > 0.0:
        probs = torch.softmax(scaled, dim=-1)
        m = min_p.to(scaled.device, torch.float32)[:, None] if per_row_min_p else min_p
        kept = probs >= probs.amax(dim=-1, keepdim=True) * m  # a row at 0 keeps every token
        scaled = scaled.masked_fill(~kept, float("-inf"))
    per_row_k = isinstance(top_k, torch.Tensor)
    if per_row_k or 0 < top_k < vocab:
        k = top_k.to(scaled.device)[:, None] if per_row_k else torch.tensor(top_k)
        k = torch.where(k > 0, k, vocab).clamp(max=vocab)  # 0: every token
        largest = scaled.topk(int(k.max()), dim=-1).values
        kth = largest.gather(-1, (k - 1).expand(*largest.shape[:-1], 1))
        # Fewer than k left by min-p: the k-th is -inf, and min-p's mask still holds.
        kept = kept & (scaled >= kth)
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
