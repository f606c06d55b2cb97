"""Per-role shares of time and token rates over a sliding window, from what completions
say about themselves."""

from __future__ import annotations

import pytest

from asyncrl.runtime.contract.bus import TimeBucket
from asyncrl.runtime.scheduler.service.activity import RoleActivity, parse_activity


def spent(**seconds: float) -> list[int]:
    """An activity's ``us`` list from seconds per bucket name."""
    out = [0] * len(TimeBucket)
    for name, s in seconds.items():
        out[TimeBucket[name.upper()]] = round(s * 1e6)
    return out


def test_shares_are_parts_of_the_time_reported_and_add_up_to_one() -> None:
    a = RoleActivity(now=0.0, window_s=10.0)
    a.add("generate", {"tokens": 400, "us": spent(compute=4, scheduler=1)}, now=5.0)
    a.add("generate", {"tokens": 600, "us": spent(compute=4, waiting_for_work=1)}, now=10.0)
    train = spent(compute=2, payloads=1, weights=0.5, other=0.5)
    a.add("train", {"tokens": 100, "us": train}, now=10.0)
    rates = a.rates(10.0, {"generate": 2, "train": 1, "reward": 1})
    generate = rates["generate"]
    assert generate["workers"] == 2 and generate["tokens_per_s"] == 100.0
    assert generate["compute"] == 0.8 and generate["scheduler"] == 0.1
    assert generate["waiting_for_work"] == 0.1 and generate["reported_s"] == 10.0
    train = rates["train"]
    assert (train["compute"], train["payloads"], train["weights"]) == (0.5, 0.25, 0.125)
    for role in ("generate", "train"):
        assert sum(rates[role][b.key] for b in TimeBucket) == pytest.approx(1.0)
    assert "reward" not in rates  # it never reported: nothing to say


def test_old_completions_leave_the_window_exactly() -> None:
    a = RoleActivity(now=0.0, window_s=10.0)
    a.add("logp", {"tokens": 50, "us": spent(compute=5)}, now=1.0)
    a.add("logp", {"tokens": 20, "us": spent(compute=1, scheduler=1)}, now=8.0)
    assert a.rates(12.0, {"logp": 1})["logp"]["compute"] == 0.5  # only the second is left
    assert a.rates(12.0, {"logp": 1})["logp"]["tokens_per_s"] == 2.0
    assert a.rates(30.0, {"logp": 1}) == {
        "logp": {"workers": 1, "tokens_per_s": 0.0, "reported_s": 0.0}
    }
    a.add("logp", {"tokens": 3, "us": spent(weights=2)}, now=31.0)
    assert a.rates(31.0, {"logp": 1})["logp"]["weights"] == 1.0  # nothing left over


def test_a_role_without_workers_now_is_left_out() -> None:
    a = RoleActivity(now=0.0)
    a.add("reward", {"tokens": 0, "us": spent(compute=1)}, now=1.0)
    assert a.rates(2.0, {}) == {}


@pytest.mark.parametrize(
    "activity",
    [
        None,
        "busy",
        {"tokens": 3},  # no time
        {"tokens": 3, "us": [1, 2]},  # too few buckets
        {"tokens": 3, "us": [1, 2, 3, 4, 5, -6]},  # negative
        {"tokens": 3, "us": [1.5, 2, 3, 4, 5, 6]},  # not microseconds
        {"busy_s": 1.0, "tokens": 3},  # an older worker's form
    ],
)
def test_malformed_activity_is_ignored(activity: object) -> None:
    assert parse_activity(activity) is None
    a = RoleActivity(now=0.0)
    a.add("logp", activity, now=1.0)
    assert a.rates(2.0, {"logp": 1}) == {}


def test_bad_token_counts_count_as_none() -> None:
    one_second = spent(compute=1)
    assert parse_activity({"tokens": -1, "us": one_second}) == (0, one_second)
    assert parse_activity({"tokens": True, "us": one_second}) == (0, one_second)
