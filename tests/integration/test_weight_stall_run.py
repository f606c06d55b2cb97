"""A weight plane that cannot deliver says so, in a real run: the trainer announces its
versions at an address that never answers (tests/support/silent_weights_roles.py). Once a
version is published that no follower can fetch, ``asyncrl run``'s terminal gets a line
naming the follower, its source and the reason after ``weights.stall_warning_s``, and the
run stops with that error after ``weights.stall_stop_s``: never an endless retry."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.heavy]  # a run to its first step, and 12 s

WARNING_S, STOP_S = 4, 12


def test_a_source_that_never_answers_is_said_on_the_terminal_and_stops_the_run(
    tmp_path: Path,
) -> None:
    command = [
        *(sys.executable, "-m", "asyncrl.runtime.launch.cli.main", "run"),
        *("-c", "deploy/configs/default.yaml", f"run.dir={tmp_path / 'run'}"),
        "pipeline.actors=tests.support.silent_weights_roles",
        "weights.map_on_host=false",
        "weights.stall_timeout_s=1",
        f"weights.stall_warning_s={WARNING_S}",
        f"weights.stall_stop_s={STOP_S}",
        "run.total_steps=50",
        "data.val_every_versions=0",
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    seconds = time.monotonic() - started
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr[-3000:]
    said = [line for line in lines if "no weights reach" in line]
    assert said, done.stderr[-3000:]
    warned = {}  # each follower's first warning line; the generator and logp both follow
    for line in said:
        follower = re.search(r"no weights reach (\S+) from train-0: ", line)
        assert follower and "no header in 1 s" in line, line
        warned.setdefault(follower.group(1), line)
    stopping = [line for line in lines if line.startswith("asyncrl run: stopping: ")]
    assert stopping, done.stderr[-3000:]
    stopped = re.match(r"asyncrl run: stopping: (\S+) cannot go on: ", stopping[0])
    assert stopped and stopped.group(1) in warned, (stopping, sorted(warned))
    assert f"got no version from train-0 in {STOP_S} s" in stopping[0]
    assert lines.index(warned[stopped.group(1)]) < lines.index(stopping[0])
    assert seconds < 240
