"""Per-token versions across pauses and updates, and partial rollouts after an abort."""

from __future__ import annotations

import pytest

from asyncrl.actors.engines.sglang.token_versions import Ledger


def entries(tokens: list[int], start: int = 0) -> list[tuple[float, int, None]]:
    """SGLang's output_token_logprobs for ``tokens`` (log-prob -0.1 * position)."""
    return [(-0.1 * (start + i), t, None) for i, t in enumerate(tokens)]


def test_a_request_spanning_two_updates_is_tagged_token_by_token() -> None:
    ledger = Ledger(version=0)
    ledger.begin("a", (1, 2), budget=10)
    streamed: list[int] = []
    for version, chunk in [(None, [5, 6]), (None, [7]), (1, [8, 9]), (2, [10])]:
        if version is not None:
            ledger.update(version)  # the engine paused, loaded, continued
        streamed += chunk
        assert ledger.report("a", entries(streamed)) == chunk  # cumulative, as SGLang streams
    done = ledger.finish("a")
    assert done.tokens == [5, 6, 7, 8, 9, 10]
    assert done.versions == [0, 0, 0, 1, 1, 2]
    assert done.logprobs == pytest.approx([-0.1 * i for i in range(6)])


def test_incremental_reports_are_appended() -> None:
    ledger = Ledger(version=3)
    ledger.begin("a", (1,), budget=10)
    ledger.report("a", entries([5, 6]), cumulative=False)
    ledger.update(4)
    ledger.report("a", entries([7]), cumulative=False)
    done = ledger.finish("a")
    assert (done.tokens, done.versions) == ([5, 6, 7], [3, 3, 4])


def test_requests_started_under_different_versions_keep_their_own_tags() -> None:
    ledger = Ledger()
    ledger.begin("old", (1,), budget=10)
    ledger.report("old", entries([5]))
    ledger.update(1)
    ledger.begin("new", (2,), budget=10)
    ledger.report("new", entries([8]))
    ledger.report("old", entries([5, 6]))
    assert ledger.finish("old").versions == [0, 1]
    assert ledger.finish("new").versions == [1]


def test_an_aborted_request_goes_on_from_prompt_and_prefix_with_the_new_version() -> None:
    ledger = Ledger(version=0)
    rollout = ledger.begin("a", (1, 2, 3), budget=5)
    ledger.report("a", entries([7, 8]))
    # The engine aborts it (a pause that drops requests); the new version is loaded.
    ledger.update(1)
    again = ledger.resubmit("a")
    assert again is rollout and again.submissions == 2
    assert again.input_ids == [1, 2, 3, 7, 8] and again.remaining == 3
    # The new stream reports only its own tokens, from the start again.
    ledger.report("a", entries([9], start=2))
    ledger.report("a", entries([9, 4], start=2))
    done = ledger.finish("a")
    assert done.prompt == (1, 2, 3)
    assert done.tokens == [7, 8, 9, 4]
    assert done.versions == [0, 0, 1, 1]
    assert done.logprobs == pytest.approx([0.0, -0.1, -0.2, -0.3])


def test_a_request_with_no_budget_left_is_not_continued() -> None:
    ledger = Ledger()
    ledger.begin("a", (1,), budget=2)
    ledger.report("a", entries([5, 6]))
    with pytest.raises(ValueError, match="no budget"):
        ledger.resubmit("a")


def test_versions_only_go_up_and_tags_are_unique() -> None:
    ledger = Ledger(version=2)
    with pytest.raises(ValueError, match="only go up"):
        ledger.update(1)
    ledger.begin("a", (1,), budget=1)
    with pytest.raises(ValueError, match="already running"):
        ledger.begin("a", (1,), budget=1)


def test_cut_keeps_tokens_logprobs_and_versions_aligned() -> None:
    ledger = Ledger()
    rollout = ledger.begin("a", (1,), budget=9)
    ledger.report("a", entries([5, 6, 7]))
    rollout.cut(1)
    assert (rollout.tokens, rollout.logprobs, rollout.versions) == ([5], [0.0], [0])


def test_a_cumulative_report_that_does_not_extend_what_was_taken_is_refused() -> None:
    ledger = Ledger()
    ledger.begin("a", (1,), budget=9)
    ledger.report("a", entries([5, 6]))
    assert ledger.report("a", []) == []  # a final report without log-probs adds nothing
    with pytest.raises(ValueError, match="went back"):
        ledger.report("a", entries([5]))
    with pytest.raises(ValueError, match="reported as 7"):
        ledger.report("a", entries([5, 7, 8]))
