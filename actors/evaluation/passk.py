"""pass@k by the unbiased estimator.

Of n samples drawn for a prompt, c are correct. pass@k is the chance that at least one of
k samples is correct; estimated from the n (n >= k) without bias as one minus the chance
that k of them drawn without replacement are all wrong: 1 - C(n - c, k) / C(n, k). The
ratio of binomials is computed as a product, prod_{i = n - c + 1}^{n} (1 - k / i), which
stays in floating-point range for any n (the binomials themselves overflow past n ~ 1000).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["mean_pass_at_k", "pass_at_k", "pass_ks"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``c`` correct samples out of ``n``."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} of {n} samples: k must be in [1, n]")
    if not 0 <= c <= n:
        raise ValueError(f"{c} correct of {n} samples: expected 0 <= c <= n")
    if n - c < k:
        return 1.0  # every draw of k holds a correct one
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k averaged over prompts, each given as its samples' correctness."""
    if not correct:
        raise ValueError("pass@k of no prompts")
    return math.fsum(pass_at_k(len(row), sum(row), k) for row in correct) / len(correct)


def pass_ks(samples: int) -> list[int]:
    """The k reported for ``samples`` per prompt: the powers of two below it, and itself."""
    if samples < 1:
        raise ValueError(f"samples={samples}: expected an integer >= 1")
    ks = []
    k = 1
    while k < samples:
        ks.append(k)
        k *= 2
    return [*ks, samples]
