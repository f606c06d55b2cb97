"""Hypothesis profiles: `ci` (the default, hundreds of examples) and `long` for a local soak
(choose with HYPOTHESIS_PROFILE=long); and no payload left in shared memory after a run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

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


@pytest.fixture(scope="session", autouse=True)
def _no_payloads_left_in_shared_memory() -> Iterator[None]:
    """Tests kill workers outright; what their stores kept in /dev/shm goes at the end
    (as ``asyncrl run`` does after its run), not when some later store happens to start.
    So do stores that in-process tests made here and left open: no test runs now."""
    yield
    shared = default_shared_dir()
    if shared is not None:
        sweep_stale(shared, mine_too=True)
