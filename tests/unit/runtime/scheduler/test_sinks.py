"""logging.backends: step lines flattened to scalars, each backend's file read back, and a
failing backend dropped without stopping the metrics file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from asyncrl.runtime.scheduler.service.metrics import MetricsLog
from asyncrl.runtime.scheduler.service.sinks import flatten, open_sinks

LINE = {"step": 3, "reward_mean": 0.5, "ok": True, "keys": ["a"],
        "roles": {"train": {"tokens_per_s": 10.0, "compute": 0.7}}}  # fmt: skip


def test_a_step_line_flattens_to_its_numbers() -> None:
    assert dict(flatten(LINE)) == {
        "step": 3.0,
        "reward_mean": 0.5,
        "roles.train.tokens_per_s": 10.0,
        "roles.train.compute": 0.7,
    }


class _Broken:
    closed = False

    def step(self, step: int, scalars: Mapping[str, float]) -> None:
        raise OSError("disk full")

    def close(self) -> None:
        self.closed = True


def test_a_failing_backend_is_dropped_and_the_file_goes_on(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl", [_Broken()])
    log.append(LINE)
    log.append({**LINE, "step": 4})
    assert log.sinks == []
    log.close()
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 4]


def test_tensorboard_scalars_read_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path / "metrics.jsonl", open_sinks(["tensorboard"], tmp_path, "t", {}))
    for step in (1, 2):
        log.append({**LINE, "step": step, "reward_mean": step / 4})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(1, 0.25), (2, 0.5)]
    assert events.Scalars("roles.train.compute")[0].value == pytest.approx(0.7)


def test_wandb_writes_an_offline_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = MetricsLog(tmp_path / "metrics.jsonl", open_sinks(["wandb"], tmp_path, "t", {"a": 1}))
    log.append(LINE)
    log.close()
    runs = list((tmp_path / "wandb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), runs
