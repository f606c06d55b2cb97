"""Hypothesis profiles: `ci` (the default, hundreds of examples) and `long` for a local soak
(choose with HYPOTHESIS_PROFILE=long); the repository's root on the import path of every
process a test starts; and no payload left in shared memory after a run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from asyncrl.transport.dataplane.store import default_shared_dir, sweep_stale

settings.register_profile(
    "ci",
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile(
    "long",
    parent=settings.get_profile("ci"),
    max_examples=5000,
    stateful_step_count=120,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The workers tests start import the tests' own role tables (pipeline.actors:
# tests.support.demo_pipeline) as a user's workers import theirs, from the import path:
# whatever their working directory, and started as python -m or as a console script.
_REPO = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(
    [_REPO, *(part for part in os.environ.get("PYTHONPATH", "").split(os.pathsep) if part)]
)


@pytest.fixture(scope="session", autouse=True)
def _no_payloads_left_in_shared_memory() -> Iterator[None]:
    """Tests kill workers outright; what their stores kept in /dev/shm goes at the end
    (as ``asyncrl run`` does after its run), not when some later store happens to start.
    So do stores that in-process tests made here and left open: no test runs now."""
    yield
    shared = default_shared_dir()
    if shared is not None:
        sweep_stale(shared, mine_too=True)
