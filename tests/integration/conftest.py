"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
