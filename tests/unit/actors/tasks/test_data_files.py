"""Data files in verl's layout (actors/tasks/rows.py, order.py, datafiles.py): rows read
from JSONL and Parquet, bad rows named by file, row and field, a shuffled order that
resumes exactly, and the checks a run makes before it starts."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from asyncrl.actors.evaluation.sets import validation_sets
from asyncrl.actors.startup.role_checks import check_task
from asyncrl.actors.tasks.datafiles import DataFiles
from asyncrl.actors.tasks.order import ShuffledOrder
from asyncrl.actors.tasks.rows import DataFileError, read_rows
from asyncrl.actors.workload import load_workload
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from tests.support.datafiles import addition_rows, write_rows


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rows_read_back_from_either_format(tmp_path: Path, suffix: str) -> None:
    written = addition_rows("train", 5)
    rows = read_rows([str(write_rows(tmp_path / f"t{suffix}", written))], "data.train_files")
    assert [r.messages[0]["content"] for r in rows] == [w["prompt"][0]["content"] for w in written]
    assert [r.ground_truth for r in rows] == [w["reward_model"]["ground_truth"] for w in written]
    assert rows[3].data_source == "addition" and rows[3].extra_info == {
        "split": "train",
        "index": 3,
    }
    assert rows[3].where.endswith(f"t{suffix} row 3")


def test_several_files_are_read_in_order(tmp_path: Path) -> None:
    first = write_rows(tmp_path / "a.jsonl", addition_rows("train", 2))
    second = write_rows(tmp_path / "b.parquet", addition_rows("validation", 3))
    rows = read_rows([str(first), str(second)], "data.train_files")
    assert len(rows) == 5 and rows[2].where.endswith("b.parquet row 0")


def bad(row: dict[str, Any], edit: str, value: Any) -> dict[str, Any]:
    """``row`` with the field at dotted ``edit`` set to ``value`` (or removed: ...)."""
    row = copy.deepcopy(row)
    *parents, last = edit.split(".")
    node = row
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is ...:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return row


BAD_ROWS = [
    ("prompt", ..., "prompt is missing"),
    ("prompt", "4+4=", "prompt is str '4+4=', not a list of chat messages"),
    ("prompt", [], "prompt is empty (no messages)"),
    ("prompt.0.content", "  ", "prompt is empty (its messages hold no text)"),
    ("prompt.0.role", ..., "prompt[0].role is missing"),
    ("prompt.0.content", 7, "prompt[0].content is int 7, not a string"),
    ("reward_model", ..., "reward_model is missing"),
    ("reward_model.ground_truth", ..., "reward_model.ground_truth is missing"),
    ("reward_model.ground_truth", "", "reward_model.ground_truth is empty"),
    ("data_source", ..., "data_source is missing"),
    ("data_source", 3, "data_source is int 3, not a string"),
    ("extra_info", "note", "extra_info is str 'note', not a mapping"),
]


@pytest.mark.parametrize(("edit", "value", "message"), BAD_ROWS, ids=[b[2] for b in BAD_ROWS])
def test_a_bad_jsonl_row_names_the_file_the_row_and_the_field(
    tmp_path: Path, edit: str, value: Any, message: str
) -> None:
    rows = addition_rows("train", 4)
    rows[2] = bad(rows[2], edit, value)
    path = write_rows(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataFileError) as caught:
        read_rows([str(path)], "data.train_files")
    assert str(caught.value).startswith(f"{path} row 2: {message}")


@pytest.mark.parametrize(
    ("edit", "value", "message"),
    [
        ("prompt", [], "prompt is empty (no messages)"),
        ("reward_model.ground_truth", None, "reward_model.ground_truth is missing"),
        ("data_source", None, "data_source is missing"),
    ],
)
def test_a_bad_parquet_row_names_the_file_the_row_and_the_field(
    tmp_path: Path, edit: str, value: Any, message: str
) -> None:
    rows = addition_rows("train", 4)
    rows[1] = bad(rows[1], edit, value)
    path = write_rows(tmp_path / "train.parquet", rows)
    with pytest.raises(DataFileError, match=re.escape(f"train.parquet row 1: {message}")):
        read_rows([str(path)], "data.train_files")


def test_a_parquet_file_of_the_wrong_layout_is_named_at_its_first_row(tmp_path: Path) -> None:
    rows = [{"prompt": "1+1=", "answer": "2"}]
    path = write_rows(tmp_path / "flat.parquet", rows)
    with pytest.raises(DataFileError, match=r"flat\.parquet row 0: prompt is str '1\+1='"):
        read_rows([str(path)], "data.train_files")


def test_numbers_as_ground_truths_are_taken_as_text(tmp_path: Path) -> None:
    rows = addition_rows("train", 2)
    rows[1]["reward_model"]["ground_truth"] = 46
    (row,) = read_rows([str(write_rows(tmp_path / "t.jsonl", rows[1:]))], "data.train_files")
    assert row.ground_truth == "46"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.jsonl", None, r"data\.train_files: .*missing\.jsonl: no such file"),
        (
            "rows.csv",
            "a,b\n",
            r"rows\.csv: unknown file type \(expected \.jsonl, \.json, \.parquet",
        ),
        ("broken.jsonl", "{not json\n", r"broken\.jsonl: cannot be read as json: .*"),
        ("broken.parquet", "not parquet", r"broken\.parquet: cannot be read as parquet: .*"),
        ("empty.jsonl", "", r"data\.train_files: the files hold no rows"),
    ],
)
def test_a_file_that_cannot_be_read_is_one_line_naming_it(
    tmp_path: Path, name: str, content: str | None, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataFileError, match=message) as caught:
        read_rows([str(path)], "data.train_files")
    assert "\n" not in str(caught.value)


def test_the_order_takes_every_row_once_per_epoch_in_a_new_shuffle() -> None:
    order = ShuffledOrder(50, seed=3)
    epochs = [[order.row(e * 50 + i) for i in range(50)] for e in range(3)]
    assert all(sorted(epoch) == list(range(50)) for epoch in epochs)
    assert epochs[0] != list(range(50)) and epochs[0] != epochs[1] != epochs[2]
    assert ShuffledOrder(50, seed=4).permutation(0) != epochs[0]


def test_the_order_is_a_function_of_the_index_alone_so_a_restart_resumes_exactly() -> None:
    run = ShuffledOrder(37, seed=0)
    first = [run.row(i) for i in range(100)]
    restarted = ShuffledOrder(37, seed=0)  # a new dataloader, offering keys from 0 again
    assert [restarted.row(i) for i in range(100)] == first
    resumed = ShuffledOrder(37, seed=0)  # or one asked from the middle of an epoch on
    assert [resumed.row(i) for i in range(61, 100)] == first[61:]
    # Pinned: the order depends on no library's random stream, so it must not drift.
    assert first[:8] == ShuffledOrder(37, seed=0).permutation(0)[:8]


def files_config(tmp_path: Path, train: Path, val: Path | None = None, **more: Any) -> RunConfig:
    data = {"train_files": str(train)}
    data |= {"val_files": [str(val)]} if val else {"val_every_versions": 0}
    return config_from_dict({"run": {"dir": str(tmp_path / "run")}, "data": data, **more})


def test_the_workload_renders_prompts_with_the_models_template(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "t.parquet", addition_rows("train", 20))
    val = write_rows(tmp_path / "v.jsonl", addition_rows("validation", 3))
    task = load_workload(files_config(tmp_path, train, val))
    assert isinstance(task, DataFiles)
    prompts = {task.sample("train", i).prompt for i in range(20)}
    assert prompts == {r["prompt"][0]["content"] for r in addition_rows("train", 20)}
    row = addition_rows("validation", 3)[1]
    sample = task.sample("validation", 1)
    assert sample.prompt == row["prompt"][0]["content"]  # the embedded template adds nothing
    assert sample.answer == row["reward_model"]["ground_truth"]
    # What verl's reward functions read beside the answer reaches ours in the sample.
    assert sample.data_source == "addition" and sample.extra_info == row["extra_info"]
    assert [dict(m) for m in sample.messages] == row["prompt"]  # for a harness's chat call
    sets = validation_sets(task, 128)  # a finite split: all there are
    assert [(s.name, len(s.samples)) for s in sets] == [("addition", 3)]
    with pytest.raises(IndexError):
        task.sample("validation", 3)


def test_a_prompt_longer_than_the_generator_takes_is_named(tmp_path: Path) -> None:
    rows = addition_rows("train", 3)
    rows[2]["prompt"][0]["content"] = "1+" * 40 + "1="
    train = write_rows(tmp_path / "t.jsonl", rows)
    problems = check_task(files_config(tmp_path, train, model={"max_prompt_tokens": 32}))
    assert problems == [
        f"{train} row 2: the prompt is 82 tokens; the generator takes 32 "
        "(model.max_prompt_tokens, less max_new_tokens at the model's positions)"
    ]


def test_the_checks_before_a_run_read_the_files(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "t.jsonl", addition_rows("train", 3))
    val = write_rows(tmp_path / "v.jsonl", addition_rows("validation", 3))
    assert check_task(files_config(tmp_path, train, val)) == []
    (missing,) = check_task(files_config(tmp_path, tmp_path / "nope.parquet", val))
    assert missing == f"data.train_files: {tmp_path / 'nope.parquet'}: no such file"
    rows = addition_rows("validation", 3)
    rows[0]["prompt"] = []
    write_rows(val, rows)
    assert check_task(files_config(tmp_path, train, val)) == [
        f"{val} row 0: prompt is empty (no messages)"
    ]


def test_a_model_without_a_chat_template_cannot_take_data_files(tmp_path: Path) -> None:
    from tests.support.models import tiny_model

    model = tiny_model(tmp_path / "model")
    (model / "chat_template.jinja").unlink(missing_ok=True)
    train = write_rows(tmp_path / "t.jsonl", addition_rows("train", 3))
    (line,) = check_task(files_config(tmp_path, train, model={"path": str(model)}))
    assert line.endswith(
        "no chat template (chat_template.jinja, or chat_template in "
        "tokenizer_config.json); chat prompts need one"
    )


def test_data_files_take_one_path_or_a_list_and_need_validation_files() -> None:
    from asyncrl.runtime.contract.config import ConfigError, load_config

    one = load_config(None, ["data.train_files=t.parquet", "data.val_files=v.parquet"])
    assert (one.data.train_files, one.data.val_files) == (["t.parquet"], ["v.parquet"])
    many = load_config(None, ["data.train_files=[a.jsonl, b.parquet]", "data.val_every_versions=0"])
    assert many.data.train_files == ["a.jsonl", "b.parquet"] and many.data.val_files == []
    with pytest.raises(ConfigError, match=r"data\.val_files: got none with data\.train_files set"):
        load_config(None, ["data.train_files=t.parquet"])
