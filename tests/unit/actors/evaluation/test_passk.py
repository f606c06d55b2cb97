"""pass@k's unbiased estimator, against enumeration and against hand-computed cases."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from asyncrl.actors.evaluation.passk import mean_pass_at_k, pass_at_k, pass_ks


def _enumerated(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in subset) for subset in subsets) / len(subsets)


def test_pass_at_k_equals_the_enumeration_of_every_draw_of_k() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        assert pass_at_k(n, c, k) == pytest.approx(_enumerated(n, c, k), abs=1e-12), (n, c, k)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (2, 1, 1, 1 / 2),
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (8, 3, 4, 1 - 5 / 70),  # 1 - C(5,4)/C(8,4)
        (16, 4, 1, 4 / 16),  # pass@1 is the share correct
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (3, 1, 3, 1.0),  # all three drawn: the correct one among them
        (6, 2, 5, 1.0),  # only 4 wrong: any 5 hold a correct one
    ],
)
def test_pass_at_k_of_hand_computed_cases(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_stays_exact_where_the_binomials_overflow_a_float() -> None:
    # C(2000, 1000) is about 1e600: the product form never forms it.
    assert pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000, rel=1e-12)
    expected = 1 - math.comb(1990, 1000) / math.comb(2000, 1000)  # exact integers
    assert pass_at_k(2000, 10, 1000) == pytest.approx(expected, rel=1e-12)


def test_mean_pass_at_k_averages_prompts_alike() -> None:
    correct = [[True, False, False, False], [True, True, False, False], [False] * 4]
    assert mean_pass_at_k(correct, 1) == pytest.approx((1 / 4 + 2 / 4 + 0) / 3)
    assert mean_pass_at_k(correct, 2) == pytest.approx((1 / 2 + (1 - 1 / 6) + 0) / 3)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 0), (4, 1, 5), (4, 5, 1), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match=r"pass@|correct of"):
        pass_at_k(n, c, k)


def test_the_k_reported_are_powers_of_two_and_k_itself() -> None:
    assert pass_ks(1) == [1]
    assert pass_ks(4) == [1, 2, 4]
    assert pass_ks(6) == [1, 2, 4, 6]
    assert pass_ks(16) == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="samples=0"):
        pass_ks(0)
