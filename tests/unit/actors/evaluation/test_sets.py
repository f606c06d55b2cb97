"""Validation sets: a workload's validation prompts grouped by data source."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.actors.evaluation.sets import validation_sets
from asyncrl.actors.tasks.arithmetic import task as arithmetic
from asyncrl.actors.workload import load_workload
from asyncrl.runtime.contract.config import config_from_dict
from tests.support.datafiles import addition_rows, write_rows


def test_a_generated_task_is_one_set_of_its_first_prompts() -> None:
    sets = validation_sets(arithmetic, 5)
    assert [s.name for s in sets] == [arithmetic.name]
    assert [s.prompt for s in sets[0].samples] == [
        arithmetic.sample("validation", i).prompt for i in range(5)
    ]


def test_data_files_are_grouped_by_source_and_named_after_the_file_without_one(
    tmp_path: Path,
) -> None:
    train = write_rows(tmp_path / "train.jsonl", addition_rows("train", 8))
    rows = addition_rows("validation", 6)
    for row in rows[:3]:
        row["data_source"] = ""  # counted under its file's name
    first = write_rows(tmp_path / "easy.jsonl", rows[:3])
    mixed = rows[3:]
    mixed[1]["data_source"] = "carry"
    second = write_rows(tmp_path / "hard.jsonl", mixed)
    cfg = config_from_dict(
        {"data": {"train_files": [str(train)], "val_files": [str(first), str(second)]}}
    )
    task = load_workload(cfg)
    sets = validation_sets(task, 128)
    assert [(s.name, len(s.samples)) for s in sets] == [("easy", 3), ("addition", 2), ("carry", 1)]
    # At most per_set of each, in file order.
    sets = validation_sets(task, 1)
    assert [(s.name, s.samples[0].prompt) for s in sets] == [
        ("easy", rows[0]["prompt"][0]["content"]),
        ("addition", rows[3]["prompt"][0]["content"]),
        ("carry", rows[4]["prompt"][0]["content"]),
    ]


def test_a_set_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="val_prompts=0"):
        validation_sets(arithmetic, 0)
