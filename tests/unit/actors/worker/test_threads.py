"""How many torch threads a model-holding worker takes (backends.cpu_threads)."""

from __future__ import annotations

import pytest

from asyncrl.actors.worker.threads import threads_for
from asyncrl.runtime.contract.config import config_from_dict


def config(threads: int, staleness: int, generators: int = 1):
    return config_from_dict(
        {
            "backends": {"cpu_threads": threads},
            "pipeline": {"max_staleness": staleness, "workers": {"generate": generators}},
        }
    )


@pytest.mark.parametrize(
    ("threads", "staleness", "generators", "role", "expected"),
    [
        (3, 0, 1, "train", 3),  # a number is taken as it is
        (3, 2, 1, "logp", 3),
        (0, 0, 1, "train", 8),  # synchronous: the phases take turns on every core
        (0, 0, 1, "generate", 8),
        (0, 0, 2, "generate", 4),  # shared among the role's workers
        (0, 0, 1, "values", 8),  # PPO's: values are made, then the critic trains, alone
        (0, 0, 1, "critic", 8),
        (0, 0, 1, "logp", 1),
        (0, 2, 1, "critic", 1),
        (0, 2, 1, "train", 1),  # asynchronous: side by side, a core each
        (0, 2, 1, "generate", 1),
    ],
)
def test_threads_per_worker(
    threads: int, staleness: int, generators: int, role: str, expected: int
) -> None:
    assert threads_for(config(threads, staleness, generators), role, cores=8) == expected
