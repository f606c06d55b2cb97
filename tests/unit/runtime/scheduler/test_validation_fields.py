"""What a step's metrics line takes from the newest validation report."""

from __future__ import annotations

from pathlib import Path

from asyncrl.runtime.scheduler.service.reports import ReportLog, step_fields


def _fields(tmp_path: Path, line: dict) -> dict:
    log = ReportLog(tmp_path / "validation.jsonl")
    log.record(7, line)
    return step_fields({"validation": log})


def test_a_greedy_pass_of_one_source_gives_its_reward_and_version(tmp_path: Path) -> None:
    line = {
        "val_reward": 0.5,
        "val_pass@1": 0.5,
        "val_pass_ks": [1],
        "val_by_source": {"arithmetic": {"reward": 0.5, "pass@1": 0.5}},
    }
    assert _fields(tmp_path, line) == {"val_reward": 0.5, "val_version": 7}


def test_pass_at_k_and_each_source_come_along_when_there_is_more_to_say(tmp_path: Path) -> None:
    line = {
        "val_reward": 0.4,
        "val_pass@4": 0.7,
        "val_pass@2": 0.6,
        "val_pass_ks": [1, 2, 4],
        "val_by_source": {
            "gsm": {"reward": 0.5, "pass@4": 0.8, "best_reward": 0.8},
            "math": {"reward": 0.3, "pass@4": 0.6},
        },
    }
    assert _fields(tmp_path, line) == {
        "val_reward": 0.4,
        "val_version": 7,
        "val_pass@4": 0.7,
        "val_by_source": {
            "gsm": {"reward": 0.5, "pass@4": 0.8},
            "math": {"reward": 0.3, "pass@4": 0.6},
        },
    }


def test_an_older_runs_line_gives_what_it_has(tmp_path: Path) -> None:
    assert _fields(tmp_path, {"val_reward": 0.25, "val_prompts": 16}) == {
        "val_reward": 0.25,
        "val_version": 7,
    }
