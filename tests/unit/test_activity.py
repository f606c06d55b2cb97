"""Per-role rates over a sliding window, from what completions say about themselves."""

from __future__ import annotations

from asyncrl.runtime.service.activity import RoleActivity


def test_rates_cover_the_window_and_every_worker_of_a_role() -> None:
    a = RoleActivity(now=0.0, window_s=10.0)
    a.add("generate", {"busy_s": 4.0, "tokens": 400}, now=5.0)
    a.add("generate", {"busy_s": 6.0, "tokens": 600}, now=10.0)
    a.add("train", {"busy_s": 2.5, "tokens": 100}, now=10.0)
    rates = a.rates(10.0, {"generate": 2, "train": 1, "reward": 1})
    assert rates["generate"] == {"tokens_per_s": 100.0, "idle_frac": 0.5}  # 10 s of 2 x 10 s
    assert rates["train"] == {"tokens_per_s": 10.0, "idle_frac": 0.75}
    assert "reward" not in rates  # it never reported: nothing to say


def test_old_completions_leave_the_window_and_bad_input_is_ignored() -> None:
    a = RoleActivity(now=0.0, window_s=10.0)
    a.add("logp", {"busy_s": 5.0, "tokens": 50}, now=1.0)
    a.add("logp", {"busy_s": "x", "tokens": -3}, now=2.0)
    a.add("logp", None, now=3.0)
    assert a.rates(30.0, {"logp": 1}) == {"logp": {"tokens_per_s": 0.0, "idle_frac": 1.0}}
