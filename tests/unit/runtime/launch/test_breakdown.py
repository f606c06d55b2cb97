"""What ``asyncrl inspect`` makes of a run's step lines (made up here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.runtime.launch.cli._breakdown import breakdown, render_breakdown, step_lines


def shares(compute: float, waiting: float, **rest: float) -> dict[str, float]:
    out = {"compute": compute, "waiting_for_work": waiting, "scheduler": 0.0, "payloads": 0.0,
           "weights": 0.0, "other": 0.0}  # fmt: skip
    return {**out, **rest}


def line(step: int, elapsed: float, **fields: object) -> dict[str, object]:
    return {"step": step, "elapsed_s": elapsed, **fields}


def test_role_shares_are_weighted_by_the_time_each_line_stands_for() -> None:
    lines = [
        line(1, 10.0, roles={"train": {"workers": 1, "tokens_per_s": 100.0, **shares(0.5, 0.5)}}),
        line(2, 40.0, roles={"train": {"workers": 1, "tokens_per_s": 200.0, **shares(0.9, 0.1)}}),
        # a scheduler restart: elapsed_s starts again, this line stands for its own 10 s
        line(3, 10.0, roles={"train": {"workers": 2, "tokens_per_s": 0.0, "reported_s": 0.0}}),
    ]
    report = breakdown(lines)
    train = report["roles"]["train"]
    assert train["compute"] == pytest.approx((10 * 0.5 + 30 * 0.9) / 40)
    assert train["waiting_for_work"] == pytest.approx((10 * 0.5 + 30 * 0.1) / 40)
    assert train["tokens_per_s"] == pytest.approx((10 * 100 + 30 * 200 + 10 * 0) / 50, abs=0.05)
    assert train["workers"] == 2  # as the newest line says
    assert report["roles_last"] == lines[-1]["roles"]
    assert (report["steps"], report["last_step"], report["elapsed_s"]) == (3, 3, 10.0)


def test_a_steps_later_legs_are_joined_from_a_later_line() -> None:
    lines = [
        line(1, 1.0, critical_path={"ready_to_leased_s": 0.1, "leased_to_trained_s": 1.0}),
        line(
            2,
            2.0,
            critical_path={
                "ready_to_leased_s": 0.3,
                "trainer_busy_s": 0.2,
                "leased_to_trained_s": 2.0,
            },
            versions_loaded=[
                {"step": 1, "trained_to_published_s": 0.01, "published_to_loaded_s": 0.2}
            ],
        ),
        line(
            3,
            3.0,
            critical_path={"ready_to_leased_s": 0.5, "leased_to_trained_s": 3.0},
            versions_loaded=[
                {"step": 2, "trained_to_published_s": 0.03, "published_to_loaded_s": 0.4}
            ],
        ),
    ]
    path = breakdown(lines)["critical_path"]
    assert (path["steps"], path["whole"]) == (3, 2)
    # medians over the steps whose whole path is known (1 and 2), so the rows agree
    assert path["median"]["ready_to_leased_s"] == pytest.approx(0.2)
    assert path["median"]["published_to_loaded_s"] == pytest.approx(0.3)
    assert path["median"]["total_s"] == pytest.approx((1.31 + 2.73) / 2)
    assert path["median"]["trainer_busy_s"] == 0.2  # only step 2 says
    # the newest step whose whole path is known, not step 3 (its version came after the end)
    assert path["last"] == {
        "step": 2,
        "ready_to_leased_s": 0.3,
        "trainer_busy_s": 0.2,
        "trainer_free_s": 0.1,
        "leased_to_trained_s": 2.0,
        "trained_to_published_s": 0.03,
        "published_to_loaded_s": 0.4,
        "total_s": 2.73,
    }
    only_first = breakdown(lines[:1])["critical_path"]  # nothing whole: each leg's steps
    assert only_first["whole"] == 0 and only_first["median"]["leased_to_trained_s"] == 1.0


def test_torn_and_foreign_lines_are_skipped_and_the_table_reads(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    good = line(
        1,
        5.0,
        roles={"generate": {"workers": 1, "tokens_per_s": 812.25, **shares(0.75, 0.25)}},
        critical_path={"ready_to_leased_s": 0.01, "leased_to_trained_s": 0.5},
    )
    metrics.write_text(json.dumps(good) + "\n" + '["not a step"]\n{"step": 2, "ela')
    lines = step_lines(metrics)
    assert lines == [good]
    table = render_breakdown(breakdown(lines), "a run")
    assert "generate" in table and "812.2" in table and "75.0%" in table
    assert "batch ready -> train lease" in table and "0.0100" in table
    assert step_lines(tmp_path / "missing.jsonl") == []
    assert "no train step yet" in render_breakdown(breakdown([]), "a run")


def test_each_learners_step_is_split_into_its_phases_and_a_line_without_them_is_skipped() -> None:
    def phases(prefix: str, step: float, update: float, checkpoint: float = 0.0) -> dict:
        names = ("step_s", "update_s", "stage_s", "gather_s", "checkpoint_s")
        values = (step, update, 0.01, 0.02, checkpoint)
        return {f"{prefix}_{n}": v for n, v in zip(names, values, strict=True)}

    lines = [
        line(1, 1.0, **phases("train", 0.3, 0.25), **phases("critic", 0.5, 0.4)),
        line(2, 2.0, **phases("train", 0.5, 0.45, checkpoint=0.2)),
        line(3, 3.0, train_step_s=9.0),  # from before the phases were written: left out
    ]
    learners = breakdown(lines)["learners"]
    assert learners["train"] == {"steps": 2, "step_s": 0.4, "update_s": 0.35, "stage_s": 0.01,
                                 "gather_s": 0.02, "checkpoint_s": 0.1}  # fmt: skip
    assert learners["critic"]["steps"] == 1 and learners["critic"]["update_s"] == 0.4
    table = render_breakdown(breakdown(lines), "run")
    assert "Where a learner's step goes" in table
    assert any(row.split()[:2] == ["critic", "1"] for row in table.splitlines())
