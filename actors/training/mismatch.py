"""How far the generator's log-probs are from the trainer side's under the same weights.

A token carries the log-prob its generator gave it (the behaviour log-prob) and the
version of the weights that sampled it; logp scores it again under the version it holds
(the proximal log-prob). Where the two versions are one, the two numbers differ only by
the engines' numerics (the run guide gives what our own decoder measured; another
engine's kernels, or bfloat16, are further apart). That gap ("training-inference
mismatch") biases the off-policy correction silently, so each step measures it on the
tokens it can:

- ``logprob_mismatch_tokens``: tokens compared (trained tokens whose behaviour version is
  the version logp scored them with, in groups logp really scored);
- ``logprob_mismatch_mean`` / ``logprob_mismatch_max``: mean and max of
  ``|trainer logp - behaviour logp|`` over them;
- ``logprob_mismatch_kl``: the k3 estimate of KL(behaviour || trainer) over them,
  ``mean(exp(d) - 1 - d)`` with ``d = trainer logp - behaviour logp`` (the tokens were
  drawn from the behaviour policy, so it is unbiased and never negative);
- ``logprob_mismatch_log_ppl``: the log-perplexity gap, the trainer's log-perplexity of
  those tokens minus the generator's, ``mean(behaviour logp - trainer logp) = -mean(d)``
  (signed: above 0 when the trainer finds the sampled tokens less likely than the
  generator did, as a lower-precision generator's own samples tend to be).

The same tokens are the ones whose ratio the engine correction acts on
(``algorithm.correction.engine``): :func:`engine_tokens`.

A group whose log-probs logp reused from the generator (``algorithm.proximal_logp:
auto``) is left out: its gap is 0 by construction. A step with no token to compare has
``logprob_mismatch_tokens`` 0 and none of the other figures.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .group import Group

__all__ = ["engine_tokens", "mismatch_metrics", "same_version_gaps", "step_mismatch"]


def same_version_gaps(
    behaviour: np.ndarray,
    versions: np.ndarray,
    mask: np.ndarray,
    scored: np.ndarray,
    scored_version: int,
) -> np.ndarray:
    """``scored - behaviour`` (float64, flat) on the ``mask``ed tokens sampled by
    ``scored_version``; every array is ``[rows, longest]``."""
    if not behaviour.shape == versions.shape == mask.shape == scored.shape:
        raise ValueError(
            f"log-probs {behaviour.shape}, versions {versions.shape}, mask {mask.shape} "
            f"and scores {scored.shape} must have one shape"
        )
    same = mask.astype(bool) & (versions == scored_version)
    return scored[same].astype(np.float64) - behaviour[same].astype(np.float64)


def mismatch_metrics(gaps: np.ndarray) -> dict[str, float | int]:
    """The step line's mismatch fields of the per-token gaps ``trainer - behaviour``."""
    if gaps.size == 0:
        return {"logprob_mismatch_tokens": 0}
    gaps = gaps.astype(np.float64)
    k3 = np.expm1(gaps) - gaps  # exp(d) - 1 - d; expm1 keeps it exact for tiny d
    return {
        "logprob_mismatch_tokens": int(gaps.size),
        "logprob_mismatch_mean": float(np.abs(gaps).mean()),
        "logprob_mismatch_max": float(np.abs(gaps).max()),
        "logprob_mismatch_kl": float(k3.mean()),
        "logprob_mismatch_log_ppl": float(-gaps.mean()),
    }


def engine_tokens(group: Group) -> np.ndarray:
    """bool ``[rows, longest]``: the trained tokens sampled by the version logp scored them
    with, in a group logp really scored (not reused): where the proximal/behaviour ratio
    is the engines' numerics alone. None of them without a logp that scored."""
    proximal, r = group.proximal, group.rollouts
    if proximal is None or proximal.reused or proximal.version is None:
        return np.zeros(r.response_ids.shape, dtype=bool)
    return r.trained_mask() & (r.versions == proximal.version)


def step_mismatch(groups: Sequence[Group]) -> dict[str, float | int]:
    """The mismatch fields of one step's ``groups`` (those logp scored)."""
    gaps = [np.zeros(0)]
    for g in groups:
        proximal, r = g.proximal, g.rollouts
        if proximal is None or proximal.reused or proximal.version is None:
            continue
        gaps.append(
            same_version_gaps(
                r.logprobs, r.versions, r.trained_mask(), proximal.logprobs, proximal.version
            )
        )
    return mismatch_metrics(np.concatenate(gaps))
