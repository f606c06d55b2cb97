"""The loss's keys of the algorithm section: overlong punishment and filtering, dual clip,
entropy bonus; each refused value is named with what is allowed."""

from __future__ import annotations

import pytest

from asyncrl.runtime.contract.config import ConfigError, config_from_dict


def test_they_are_off_by_default() -> None:
    a = config_from_dict({}).algorithm
    assert (a.overlong_buffer, a.overlong_penalty, a.overlong_filter) == (0, 1.0, False)
    assert (a.clip_ratio_c, a.entropy_coef) == (0.0, 0.0)


def test_an_overlong_buffer_as_long_as_the_budget_is_refused_naming_both() -> None:
    data = {"model": {"max_new_tokens": 16}, "algorithm": {"overlong_buffer": 16}}
    with pytest.raises(ConfigError, match=r"algorithm\.overlong_buffer.*16.*max_new_tokens=16"):
        config_from_dict(data)
    data["algorithm"]["overlong_buffer"] = 15
    assert config_from_dict(data).algorithm.overlong_buffer == 15


@pytest.mark.parametrize("c", [0.5, 1.0])
def test_a_dual_clip_of_one_or_less_is_refused(c: float) -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.clip_ratio_c.*allowed: 0 \(off\) or"):
        config_from_dict({"algorithm": {"clip_ratio_c": c}})
    assert config_from_dict({"algorithm": {"clip_ratio_c": 3.0}}).algorithm.clip_ratio_c == 3.0


@pytest.mark.parametrize(
    "key", ["overlong_buffer", "overlong_penalty", "clip_ratio_c", "entropy_coef"]
)
def test_negative_values_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"algorithm\.{key}"):
        config_from_dict({"algorithm": {key: -1}})
