"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.weight_nodes import shm_test_directory


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[Path]:
    """A slot directory for one test's mapped weights, in /dev/shm; emptied after it."""
    with shm_test_directory(tmp_path) as directory:
        yield directory
