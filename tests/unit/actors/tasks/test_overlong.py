"""The soft overlong punishment against values worked out by hand, and the length it is
taken of (a trajectory's longest turn)."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrl.actors.tasks.overlong import longest_turns, overlong_penalty


def test_the_penalty_is_zero_before_the_buffer_then_linear_down_to_minus_the_factor() -> None:
    # max_new_tokens 20, buffer 5: the buffer starts after token 15.
    lengths = np.array([1, 10, 15, 16, 18, 20])
    got = overlong_penalty(lengths, max_new_tokens=20, buffer=5, factor=1.0)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [0.0, 0.0, 0.0, -0.2, -0.6, -1.0], atol=1e-7)


def test_the_factor_scales_it_and_it_never_goes_below_minus_the_factor() -> None:
    got = overlong_penalty(np.array([17, 20, 40]), max_new_tokens=20, buffer=5, factor=0.5)
    np.testing.assert_allclose(got, [-0.2, -0.5, -0.5], atol=1e-7)
    # buffer 1: only a response of exactly max_new_tokens is punished, fully.
    got = overlong_penalty(np.array([9, 10]), max_new_tokens=10, buffer=1, factor=2.0)
    np.testing.assert_allclose(got, [0.0, -2.0])


def test_a_buffer_of_zero_is_off_and_one_as_long_as_the_budget_is_refused() -> None:
    assert overlong_penalty(np.array([80, 80]), 80, 0, 1.0).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="fewer than max_new_tokens"):
        overlong_penalty(np.array([3]), 10, 10, 1.0)


def test_a_trajectorys_length_is_its_longest_run_of_model_tokens() -> None:
    trained = np.array(
        [
            [1, 1, 1, 1, 0, 0, 0],  # single-turn, 4 tokens then padding
            [1, 1, 0, 0, 1, 1, 1],  # two turns of 2 and 3 around an observation
            [0, 1, 0, 1, 0, 0, 0],  # a second sequence of trajectory 1: shorter turns
        ],
        bool,
    )
    owners = np.array([0, 1, 1])
    assert longest_turns(trained, owners, 3).tolist() == [4, 3, 0]


def test_a_response_inside_the_budget_has_a_penalty_of_plus_zero() -> None:
    penalty = overlong_penalty(np.array([10, 64]), 80, 16, 1.0)
    assert not np.signbit(penalty).any()  # -0.0 would show as such in dumps and reports
