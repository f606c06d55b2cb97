"""A validation pass's figures per data source and overall, and its table."""

from __future__ import annotations

import pytest

from asyncrl.actors.evaluation.scores import Scores, table_text
from asyncrl.actors.evaluation.sets import ValidationSet
from asyncrl.actors.tasks import Sample


def _set(name: str, prompts: int) -> ValidationSet:
    return ValidationSet(name, tuple(Sample(f"{name}{i}", "1") for i in range(prompts)))


def _filled() -> Scores:
    scores = Scores([_set("gsm", 2), _set("math", 1)], samples=4, threshold=1.0)
    for reward in (1.0, 0.0, 0.0, 0.0):  # gsm 0: one right of four
        scores.record(0, 0, reward, 10)
    for reward in (1.0, 1.0, 0.5, 0.0):  # gsm 1: two right, a half that is not correct
        scores.record(0, 1, reward, 20)
    for _ in range(3):  # math 0: nothing right, one sample failed
        scores.record(1, 0, 0.0, 30)
    scores.failed(1, 0)
    return scores


def test_the_figures_per_source_and_overall() -> None:
    metrics = _filled().metrics()
    gsm, math = metrics["val_by_source"]["gsm"], metrics["val_by_source"]["math"]
    assert gsm["reward"] == pytest.approx(3.5 / 8)  # mean@4 over every sample
    assert gsm["best_reward"] == pytest.approx(1.0)
    assert gsm["pass@1"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert gsm["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)
    assert gsm["pass@4"] == pytest.approx(1.0)
    assert gsm["response_tokens"] == pytest.approx(15.0) and gsm["prompts"] == 2
    assert math["reward"] == 0.0 and math["pass@4"] == 0.0
    assert math["response_tokens"] == pytest.approx(90 / 4)  # the failed one counts 0 tokens
    # Overall: every prompt alike, whichever source.
    assert metrics["val_reward"] == pytest.approx(3.5 / 12)
    assert metrics["val_pass@1"] == pytest.approx((1 / 4 + 2 / 4 + 0) / 3)
    assert metrics["val_best_reward"] == pytest.approx(2 / 3)
    assert metrics["val_prompts"] == 3 and metrics["val_samples"] == 4
    assert metrics["val_pass_ks"] == [1, 2, 4] and metrics["val_sources"] == ["gsm", "math"]
    assert metrics["val_reward_errors"] == 1


def test_the_threshold_says_what_counts_as_correct() -> None:
    scores = Scores([_set("a", 1)], samples=2, threshold=0.5)
    scores.record(0, 0, 0.5, 1)
    scores.record(0, 0, 0.4, 1)
    assert scores.metrics()["val_pass@1"] == pytest.approx(0.5)


def test_a_pass_is_summarized_only_when_every_sample_is_in() -> None:
    scores = Scores([_set("a", 2)], samples=2, threshold=1.0)
    scores.record(0, 0, 1.0, 1)
    assert scores.left == 3
    with pytest.raises(ValueError, match="3 samples of the pass are not scored yet"):
        scores.metrics()
    scores.record(0, 0, 1.0, 1)
    with pytest.raises(ValueError, match="more than 2 samples"):
        scores.record(0, 0, 1.0, 1)


def test_the_table_has_a_row_per_source_and_one_for_all() -> None:
    lines = table_text(_filled().metrics()).splitlines()
    assert lines[0].split() == [
        "source",
        "prompts",
        "mean@4",
        "pass@1",
        "pass@2",
        "pass@4",
        "best",
        "tokens",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["gsm", "math", "all"]
    assert lines[1].split()[1:4] == ["2", "0.438", "0.375"]
    one_source = Scores([_set("a", 1)], samples=1, threshold=1.0)
    one_source.record(0, 0, 1.0, 3)
    lines = table_text(one_source.metrics()).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["a"]  # "all" would repeat it


def test_a_length_not_known_is_left_out_not_counted_as_zero() -> None:
    scores = Scores([_set("a", 2)], samples=1, threshold=1.0)
    scores.record(0, 0, 1.0, None)  # a harness's session: the generators saw its tokens
    scores.failed(0, 1, None)
    metrics = scores.metrics()
    assert "val_response_tokens" not in metrics
    assert "response_tokens" not in metrics["val_by_source"]["a"]
    assert metrics["val_reward"] == 0.5
