"""Validation and ``asyncrl eval`` with real processes: a run validates its last version
before it ends, ``asyncrl eval`` of its ``final/`` gives the figures the run recorded
(exactly, greedy; within sampling noise, k samples), two validation sets are reported
apart, and eval's bad input and Ctrl-C."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cluster import processes_mentioning
from tests.support.datafiles import addition_rows, write_rows

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "deploy" / "configs" / "default.yaml"
MAIN = [sys.executable, "-m", "asyncrl.runtime.launch.cli.main"]


def _asyncrl(*args: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*MAIN, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _run(tmp_path: Path, *overrides: str) -> Path:
    run_dir = tmp_path / "run"
    done = _asyncrl("run", "-c", str(DEFAULT), f"run.dir={run_dir}", *overrides, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_eval_of_a_runs_final_model_gives_its_last_validation_exactly(tmp_path: Path) -> None:
    settings = ("data.val_every_versions=3", "data.val_prompts=32")
    run_dir = _run(tmp_path, "run.total_steps=5", *settings)
    # Due at 0 and 3; the run's last version (5) validated before the run ended.
    validation = _lines(run_dir / "validation.jsonl")
    assert [v["version"] for v in validation] == [0, 3, 5]
    last = validation[-1]
    assert last["val_prompts"] == 32 and last["val_sources"] == ["arithmetic"]

    done = _asyncrl(
        "eval", "-c", str(DEFAULT), "--checkpoint", str(run_dir / "final"),
        f"run.dir={run_dir}", *settings, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "arithmetic" in done.stdout and "mean@1" in done.stdout  # the table
    (line,) = _lines(run_dir / "eval" / "final" / "eval.jsonl")
    assert line["version"] == 5 and line["checkpoint"] == str((run_dir / "final").resolve())
    for key in ("val_reward", "val_pass@1", "val_best_reward", "val_response_tokens"):
        assert line[key] == last[key], key  # greedy, the same batches: the same responses
    assert line["val_by_source"] == last["val_by_source"]
    samples = _lines(run_dir / "eval" / "final" / "samples.jsonl")
    assert len(samples) == 32
    assert sum(s["reward"] for s in samples) / 32 == last["val_reward"]
    assert processes_mentioning(str(run_dir)) == []


@pytest.mark.slow
def test_k_samples_and_two_validation_sets_are_reported_apart(tmp_path: Path) -> None:
    train = write_rows(tmp_path / "train.jsonl", addition_rows("train", 64))
    rows = addition_rows("validation", 24)
    for row in rows[:12]:
        row["data_source"] = "short"
    for row in rows[12:]:
        row["data_source"] = "long"
    easy = write_rows(tmp_path / "a.jsonl", rows[:12])
    hard = write_rows(tmp_path / "b.parquet", rows[12:])
    sampled = (
        "data.val_samples=4",
        "data.val_sampling.temperature=1.0",
        f"data.val_files=[{easy}, {hard}]",
    )
    run_dir = _run(
        tmp_path,
        f"data.train_files={train}",
        "run.total_steps=4",
        "data.val_every_versions=2",
        *sampled,
    )
    last = _lines(run_dir / "validation.jsonl")[-1]
    assert last["version"] == 4 and last["val_samples"] == 4
    assert last["val_sources"] == ["short", "long"] and last["val_pass_ks"] == [1, 2, 4]
    for figures in last["val_by_source"].values():
        assert figures["prompts"] == 12
        assert figures["pass@1"] <= figures["pass@2"] <= figures["pass@4"] <= 1
    # Every step line carries the newest validation per source; the report draws them.
    steps = _lines(run_dir / "metrics.jsonl")
    assert set(steps[-1]["val_by_source"]) == {"short", "long"}
    drawn = _asyncrl("report", str(run_dir), cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr[-3000:]
    assert (run_dir / "report" / "validation_sources.png").is_file()
    assert (run_dir / "report" / "pass_at_k.png").is_file()

    done = _asyncrl(
        "eval", "-c", str(DEFAULT), "--checkpoint", str(run_dir / "final"),
        f"run.dir={run_dir}", f"data.train_files={train}", *sampled, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "short" in done.stdout and "long" in done.stdout and "pass@4" in done.stdout
    (line,) = _lines(run_dir / "eval" / "final" / "eval.jsonl")
    assert line["val_sources"] == ["short", "long"] and line["samples"] == 4
    # 96 samples of a reward in [0, 1]: the two means differ by sampling noise alone.
    noise = 4 * math.sqrt(0.25 / 96 * 2)
    assert abs(line["val_reward"] - last["val_reward"]) <= noise, (line, last)
    assert len(_lines(run_dir / "eval" / "final" / "samples.jsonl")) == 96

    # --data instead of the run's validation files: one set of its rows.
    done = _asyncrl(
        "eval", "-c", str(DEFAULT), "--checkpoint", str(run_dir / "final"),
        f"run.dir={run_dir}", f"data.train_files={train}", f"data.val_files={easy}",
        "--data", str(hard), "--out", str(tmp_path / "other"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = _lines(tmp_path / "other" / "eval.jsonl")
    assert line["val_sources"] == ["long"] and line["val_samples"] == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--checkpoint", "{empty}"], "config.json"),
        (["--checkpoint", "{model}", "--data", "nope.jsonl"], "nope.jsonl: no such file"),
        (["--checkpoint", "{model}", "data.val_sampels=2"], "val_sampels"),
        (["--checkpoint", "{model}", "--samples", "4"], "data.val_samples: got 4"),
        (["--checkpoint", "{model}", "--samples", "0"], "--samples 0"),
    ],
)
def test_bad_input_fails_at_once_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list, says: str
) -> None:
    """The evaluation's own command, in this process: what ``asyncrl eval`` runs (the
    next test runs it whole)."""
    from asyncrl.actors.cli import main
    from asyncrl.actors.policy.checkpoint import model_dir

    (tmp_path / "empty").mkdir()
    places = {"{empty}": str(tmp_path / "empty"), "{model}": str(model_dir("embedded"))}
    argv = ["eval", *(places.get(a, a) for a in args), f"run.dir={tmp_path / 'run'}"]
    assert main(argv) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and says in errors[0], errors
    assert errors[0].startswith("asyncrl eval: error: ")
    assert not (tmp_path / "run").exists()


def test_asyncrl_eval_names_a_missing_checkpoint_in_one_line(tmp_path: Path) -> None:
    done = _asyncrl("eval", "--checkpoint", "missing", cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "asyncrl eval: error: --checkpoint missing: no such directory"
    ]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_leaves_no_file_and_no_process(tmp_path: Path, how: str) -> None:
    """Ctrl-C reaches every process of the terminal's group; a SIGTERM, the command
    alone (which passes it on). Either stops it, even where the shell that started it
    ignores SIGINT (a background job without job control, as CI may run tests)."""
    from asyncrl.actors.policy.checkpoint import model_dir

    out = tmp_path / "out"
    child = subprocess.Popen(
        [
            *MAIN, "eval", "--checkpoint", str(model_dir("embedded")), "--out", str(out),
            "data.val_prompts=4096", f"run.dir={tmp_path / 'run'}",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        start_new_session=True, preexec_fn=_ignore_sigint,
    )  # fmt: skip
    assert child.stderr is not None
    first = child.stderr.readline()  # the progress bar's first line: decoding is under way
    assert "samples" in first, first
    family = _descendants(child.pid)
    assert family, "the reward runs in a child process of its own"
    if how == "ctrl-c":
        os.killpg(child.pid, signal.SIGINT)
    else:
        child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 130, err
    assert "interrupted; nothing written" in err
    assert not out.exists() or not any(out.iterdir())
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in family if _alive(pid)] == []


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited: what a background job gets


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
