"""Fixtures shared by the integration tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.runtime.contract.rundir import RunDir
from tests.support.cluster import Cluster
from tests.support.weight_nodes import shm_test_directory


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[Path]:
    """A slot directory for one test's mapped weights, in /dev/shm; emptied after it."""
    with shm_test_directory(tmp_path) as directory:
        yield directory


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """``cluster(**sections)`` makes a Cluster (config sections override the defaults);
    every process it started is killed when the test ends, however it ends."""
    made: list[Cluster] = []

    def make(**sections: dict) -> Cluster:
        made.append(Cluster(tmp_path, **sections))
        return made[-1]

    yield make  # type: ignore[misc]
    for c in made:
        c.stop_all()


@pytest.fixture(autouse=True)
def _no_trainer_state_left_in_shared_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    """A run stopped before its end keeps its trainer's staged state in /dev/shm, on
    purpose (``--resume`` takes it up); a test's run is never resumed after the test, so
    what any run under the test's tmp_path staged goes when the test ends."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp_path: Path = request.getfixturevalue("tmp_path")  # now: it is gone after the test
    yield
    for journal in tmp_path.glob("**/journal"):
        shutil.rmtree(RunDir(journal.parent).staged_state, ignore_errors=True)
