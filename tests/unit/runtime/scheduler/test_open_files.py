"""A scheduler for a thousand workers needs two open files each: it raises its soft limit
to the hard one at start, instead of refusing workers past the common 1,024."""

from __future__ import annotations

import resource
import subprocess
import sys

PROBE = (
    "import resource; "
    "from asyncrl.runtime.scheduler.service.process import _allow_many_connections; "
    "_allow_many_connections(); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
)


def _limited(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_scheduler_raises_its_open_files_to_the_hard_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          preexec_fn=lambda: _limited(256, ceiling), check=True)  # fmt: skip
    assert int(done.stdout.split()[-1]) == ceiling
