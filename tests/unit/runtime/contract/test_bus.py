"""What scheduler and workers share about the bus: where it is, and what wakes a role."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.runtime.contract.bus import (
    Endpoints,
    announce_endpoints,
    next_port,
    read_endpoints,
    wakeup_topics,
)
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Pipeline


def test_announced_endpoints_read_back_whole(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert read_endpoints(run) is None  # no scheduler yet
    where = Endpoints("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556", True, 4321)
    announce_endpoints(run, where)
    assert read_endpoints(run) == where
    assert [p.name for p in tmp_path.iterdir()] == [run.endpoints.name]  # no temporary left


def test_the_events_port_follows_the_control_port() -> None:
    assert next_port("tcp://10.0.0.1:7000") == "tcp://10.0.0.1:7001"
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        next_port("ipc:///tmp/control")


def test_the_entry_role_wakes_when_room_opens_and_a_stage_when_its_source_fills() -> None:
    entry = wakeup_topics("dataloader", DEFAULT_PIPELINE)
    assert "transition.pending.generating" in entry  # a group taken leaves room
    assert "transition.training.trained" in entry
    assert "groups.added" not in entry
    generate = wakeup_topics("generate", DEFAULT_PIPELINE)
    assert "groups.added" in generate and "version.published" in generate
    assert "run" in entry and "run" in generate  # the end of the run wakes everyone


def test_the_entry_role_is_the_pipelines_not_a_name() -> None:
    renamed = Pipeline(DEFAULT_PIPELINE.stages, entry_role="loader")
    assert wakeup_topics("loader", renamed) == wakeup_topics("dataloader", DEFAULT_PIPELINE)
    assert wakeup_topics("dataloader", renamed) == ["run"]  # no longer a role of this table
