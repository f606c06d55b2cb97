"""Rollout dump files: appended whole, read back past a torn line, and the lines of steps
trained again after a rollback or a restart standing over the ones they replace."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from asyncrl.runtime.contract.rollout_dumps import (
    FORMAT_VERSION,
    STEPS_PER_FILE,
    append_lines,
    filtered_file,
    read_rollouts,
    steps_file,
)


def _line(step: int, gid: int, row: int = 0, start: int = 1, resumed: int = 0, **more) -> dict:
    return {
        **{"v": FORMAT_VERSION, "kind": "trained", "step": step, "gid": gid, "row": row},
        **{"trainer_start": start, "resumed_at": resumed, "reward": float(gid), **more},
    }


def _write(directory: Path, lines: list[dict]) -> None:
    for line in lines:
        append_lines(steps_file(directory, line["step"]), [line])


def test_steps_are_filed_by_range_and_read_back_by_step(tmp_path: Path) -> None:
    assert steps_file(tmp_path, 1).name == "steps-0000001-0000100.jsonl"
    assert steps_file(tmp_path, STEPS_PER_FILE).name == "steps-0000001-0000100.jsonl"
    assert steps_file(tmp_path, STEPS_PER_FILE + 1).name == "steps-0000101-0000200.jsonl"
    with pytest.raises(ValueError, match="count from 1"):
        steps_file(tmp_path, 0)
    directory = tmp_path / "rollouts"
    _write(directory, [_line(s, g, r) for s in (1, 2, 150) for g in (7, 3) for r in (0, 1)])
    dumps = read_rollouts(directory)
    assert sorted(dumps.trained) == [1, 2, 150]
    assert [(x["gid"], x["row"]) for x in dumps.trained[2]] == [(3, 0), (3, 1), (7, 0), (7, 1)]
    assert dumps.skipped == dumps.superseded == 0
    assert len(list(directory.iterdir())) == 2  # two step ranges, two files


def test_files_are_private(tmp_path: Path) -> None:
    directory = tmp_path / "rollouts"
    append_lines(steps_file(directory, 1), [_line(1, 1)])
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(steps_file(directory, 1).stat().st_mode) == 0o600


def test_a_torn_last_line_is_skipped_and_ended_before_the_next(tmp_path: Path) -> None:
    directory = tmp_path / "rollouts"
    _write(directory, [_line(1, 1), _line(1, 2)])
    path = steps_file(directory, 1)
    with path.open("ab") as file:  # a kill -9 in the middle of a write
        file.write(json.dumps(_line(2, 3)).encode()[:25])
    dumps = read_rollouts(directory)
    assert [x["gid"] for x in dumps.samples()] == [1, 2] and dumps.skipped == 1
    # The next writer ends the torn line first: its own line stays whole.
    append_lines(path, [_line(2, 4)])
    dumps = read_rollouts(directory)
    assert [x["gid"] for x in dumps.samples()] == [1, 2, 4] and dumps.skipped == 1


def test_text_is_kept_as_written(tmp_path: Path) -> None:
    directory = tmp_path / "rollouts"
    text = 'line one\nline "two" <script>alert(1)</script> \u00e9\u4e2d'
    _write(directory, [_line(1, 1, response=text)])
    (line,) = read_rollouts(directory).samples()
    assert line["response"] == text
    assert steps_file(directory, 1).read_text(encoding="utf-8").count("\n") == 1


def test_steps_trained_again_after_a_rollback_replace_the_old_ones(tmp_path: Path) -> None:
    directory = tmp_path / "rollouts"
    # Trainer A trained steps 1-6; its host was lost, the newest state left was step 3.
    first = [_line(s, 10 * s + g, start=100, resumed=0) for s in range(1, 7) for g in (1, 2)]
    # Trainer B resumed at 3 and trained step 4 again, from other groups, then died.
    second = [_line(4, 90 + g, start=200, resumed=3) for g in (1, 2)]
    # Trainer C resumed at 4 (B's state) and trained 5.
    third = [_line(5, 80 + g, start=300, resumed=4) for g in (1, 2)]
    _write(directory, first + second + third)
    dumps = read_rollouts(directory)
    assert sorted(dumps.trained) == [1, 2, 3, 4, 5]
    assert [x["gid"] for x in dumps.trained[3]] == [31, 32]  # A's, never trained again
    assert [x["gid"] for x in dumps.trained[4]] == [91, 92]  # B's
    assert [x["gid"] for x in dumps.trained[5]] == [81, 82]  # C's; A's 6 fell with its 4-6
    assert dumps.superseded == 6


def test_a_restart_without_rollback_keeps_every_line(tmp_path: Path) -> None:
    directory = tmp_path / "rollouts"
    _write(directory, [_line(s, s, start=1, resumed=0) for s in (1, 2)])
    _write(directory, [_line(s, s, start=2, resumed=2) for s in (3, 4)])
    dumps = read_rollouts(directory)
    assert sorted(dumps.trained) == [1, 2, 3, 4] and dumps.superseded == 0


def test_filtered_lines_each_process_its_own_file_newest_standing(tmp_path: Path) -> None:
    directory = tmp_path / "rollouts"
    name = filtered_file(directory, "reward/0 x").name
    assert name == f"filtered-reward_0_x-{os.getpid()}.jsonl"
    old = {"v": FORMAT_VERSION, "kind": "filtered", "gid": 5, "row": 0, "time": 1.0,
           "filtered": "task reward 1.0 for all 2 responses"}  # fmt: skip
    new = {**old, "time": 2.0, "filtered": "again"}
    append_lines(directory / "filtered-a-1.jsonl", [old])
    append_lines(directory / "filtered-b-2.jsonl", [new, {**old, "gid": 6}])
    dumps = read_rollouts(directory)
    assert [(x["gid"], x["filtered"]) for x in dumps.filtered] == [
        (6, "task reward 1.0 for all 2 responses"),
        (5, "again"),
    ]
    assert dumps.trained == {}


def test_no_directory_reads_as_empty_and_other_versions_are_skipped(tmp_path: Path) -> None:
    assert read_rollouts(tmp_path / "absent").trained == {}
    directory = tmp_path / "rollouts"
    append_lines(steps_file(directory, 1), [{**_line(1, 1), "v": FORMAT_VERSION + 1}, [1, 2]])
    dumps = read_rollouts(directory)
    assert dumps.trained == {} and dumps.skipped == 2
