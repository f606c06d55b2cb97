"""A weight plane that cannot deliver says so: a planted transport failure, a weight
source that never answers (a UCX worker that serves nothing), gets a generator's follower
to put a line on its supervisor's terminal, naming both ends and the reason, once
``stall_warning_s`` has passed, and to stop the run once ``stall_stop_s`` has."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from asyncrl.actors.actor import Actor, RunCannotGoOn
from asyncrl.actors.worker.requests import Fatal
from asyncrl.actors.worker.version_tracking import Versions
from asyncrl.actors.worker.weight_following import StallBounds, WeightFollower
from asyncrl.runtime.contract.child_status import STATUS_ENV, STOPS_THE_RUN, read_status
from asyncrl.runtime.contract.config import ConfigError, WeightsSection, config_from_dict
from asyncrl.transport import protocol as p
from asyncrl.transport.weights.base import WeightsPlan
from asyncrl.transport.weights.ucx import UcxPublisher, UcxReceiver
from asyncrl.transport.weights.ucx.node import UcxNode
from tests.unit.transport.weights.test_weights_shm import state

pytestmark = pytest.mark.timeout(60)

WARNING_S, STOP_S = 1.5, 4.0
SLACK_S = 2.0  # a loaded machine's lateness; the bounds themselves are what is checked


@pytest.fixture
def silent_source() -> Iterator[WeightsPlan]:
    """A plan for version 2 whose source, train-0, is a UCX worker that answers nothing."""
    publisher, silent = UcxPublisher(bucket_mb=1 / 1024), UcxNode()
    manifest = publisher.publish(2, state(2)).manifest
    yield WeightsPlan(2, manifest, "train-0", silent.address)
    silent.close()
    publisher.close()


def test_a_source_that_never_answers_is_said_and_then_stops_the_run(
    silent_source: WeightsPlan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = tmp_path / "generate-0.status"
    monkeypatch.setenv(STATUS_ENV, str(status))
    receiver = UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=0.5)
    bounds = StallBounds("generate-0", WARNING_S, STOP_S)
    follower = WeightFollower(receiver, lambda *_: silent_source, bounds)
    started, warned_at = time.monotonic(), None
    try:
        with pytest.raises(RunCannotGoOn) as stopped:
            while time.monotonic() - started < STOP_S + SLACK_S:
                assert follower.step(2, 1) is None
                if warned_at is None and read_status(status).warnings:
                    warned_at = time.monotonic() - started
                time.sleep(0.01)
        stopped_at = time.monotonic() - started
    finally:
        receiver.close()
    assert warned_at is not None and WARNING_S <= warned_at < WARNING_S + SLACK_S
    assert STOP_S <= stopped_at < STOP_S + SLACK_S
    (line,) = read_status(status).warnings
    for what in ("generate-0", "from train-0", "version 2 is published", "no header in 0.5 s"):
        assert what in line, line
    why = str(stopped.value)
    assert why.startswith("weights stalled: generate-0 got no version from train-0 in 4 s")
    assert "no header in 0.5 s" in why


def test_loading_a_version_starts_the_wait_over(silent_source: WeightsPlan) -> None:
    receiver = UcxReceiver(bucket_mb=1 / 1024, stall_timeout_s=0.5)
    follower = WeightFollower(receiver, lambda *_: silent_source, StallBounds("g", 0.2, 0.6))
    try:
        deadline = time.monotonic() + 1.5
        loaded = 0
        while time.monotonic() < deadline:  # a version loads every 0.3 s: never stalled
            follower.step(loaded + 2, loaded)
            loaded += 1
            time.sleep(0.3)
        follower.step(loaded, loaded)  # caught up
    finally:
        receiver.close()


class _Stalled(Actor):
    role = "generate"

    def on_version(self, version: int) -> int | None:
        raise RunCannotGoOn("weights stalled: gen-0 got no version from train-0")


def test_a_generator_that_cannot_go_on_ends_its_worker_with_the_runs_stop() -> None:
    log = structlog.get_logger("test")
    versions = Versions(_Stalled(), "gen-0", lambda *_, **__: p.Ack(), lambda: None,
                        lambda: 0.0, 1.0, log)  # fmt: skip
    versions.registered(p.Ready("gen-0", "run", p.PROTOCOL_VERSION, 1.0, 10.0, 1 << 20, 3), True)
    with pytest.raises(Fatal) as fatal:
        versions.load_newest()
    assert fatal.value.exit_code == STOPS_THE_RUN
    assert "got no version from train-0" in str(fatal.value)


def test_the_bounds_have_defaults_and_are_checked() -> None:
    defaults = WeightsSection()
    assert 0 < defaults.stall_warning_s < defaults.stall_stop_s
    for warning, stop, wrong in ((60, 60, "stall_stop_s"), (0, 10, "stall_warning_s")):
        with pytest.raises(ConfigError, match=f"weights.{wrong}"):
            config_from_dict({"weights": {"stall_warning_s": warning, "stall_stop_s": stop}})
