"""Hypothesis profiles: `ci` (the default, hundreds of examples) and `long` for a local soak.

Choose with HYPOTHESIS_PROFILE=long.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

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
