"""The payload benchmark runs: its synthetic roles over the real processes, and its report."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE
from tests.bench import payload_actors
from tests.bench.payload_plane import REPO, parse_size

pytestmark = pytest.mark.timeout(120)


def test_the_actor_module_covers_every_role() -> None:
    # The default table's roles (a harness is not what the demo runs)
    assert sorted(payload_actors.ROLES) == sorted(DEFAULT_PIPELINE.worker_roles)
    for role, cls in payload_actors.ROLES.items():
        assert cls.role == role


def test_sizes_parse_in_binary_units() -> None:
    assert parse_size("64KiB") == 65536
    assert parse_size("8mib") == 8 * 2**20
    assert parse_size("4096") == 4096
    for bad in ("1.5MiB", "10", "3GB", "KiB"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)


def test_a_short_run_of_the_working_tree_prints_its_row() -> None:
    argv = [sys.executable, "-m", "tests.bench.payload_plane", "--after-only"]
    argv += ["--sizes", "4KiB,16KiB", "--steps", "3", "--batch-groups", "4", "--repeats", "1"]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"after: asyncrl.runtime from {REPO / 'runtime'}" in out.stdout
    for size in ("4KiB", "16KiB"):
        row = re.search(rf"^\s*{size} \|\s+- +([\d.]+) +- \|\s+- +([\d.]+) ", out.stdout, re.M)
        assert row, out.stdout
        groups_per_s, cpu_ms = (float(v) for v in row.groups())
        # A dozen tiny groups may cost the scheduler less than one 10 ms CPU tick.
        assert groups_per_s > 0 and cpu_ms >= 0
    assert "scheduler CPU per group, 16KiB / 4KiB" in out.stdout
