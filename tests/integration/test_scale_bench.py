"""The scale benchmark runs: simulated workers over real sockets against the real
scheduler daemon, and a row of the curve comes out with leases granted and work done."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.scale import roles_for

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def test_the_roles_cover_the_default_pipeline() -> None:
    for n in (4, 16, 1024):
        roles = roles_for(n)
        assert len(roles) == max(n, 5)
        assert set(roles) == {"dataloader", "generate", "logp", "reward", "train"}
        assert roles.count("train") == 1 and roles.count("dataloader") == 1


@pytest.mark.heavy  # 22 s: the bench itself, not the product
def test_a_short_run_prints_a_row_of_the_curve() -> None:
    argv = [sys.executable, "-m", "tests.bench.scale", "--workers", "8", "--seconds", "3"]
    out = subprocess.run([*argv, "--hosts", "1"], cwd=REPO, capture_output=True, text=True,
                         timeout=100)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    row = out.stdout.strip().splitlines()[-1].split()
    assert row[0] == "8", out.stdout
    assert float(row[1]) > 0, out.stdout  # leases granted per second
    assert "errors" not in out.stdout
