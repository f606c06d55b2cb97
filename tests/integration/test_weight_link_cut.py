"""The UCX weight plane between two hosts (tests/support/hosts.py) whose link is cut in
the middle of a transfer and restored: the receiver fetches again from the same publisher,
neither process restarted.

While the link is cut the publisher moves on to newer versions and cancels the send that
was under way by closing its endpoint to the receiver; the receiver gives up on the
source and dials it again with a new endpoint, from the same UCX worker address. Once the
link is back the publisher must answer that one (it used to end its server thread on it,
and every fetch after that waited out its stall timeout, for as long as it lived).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.support.hosts import Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    pytest.mark.timeout(180),
    pytest.mark.heavy,  # a 12 s cut and the waits around it: its own CI stage
]

CUT_S = 12.0  # long past the 2 s in which the receiver gives up on the source
BACK_S = 20.0  # for a version to arrive after the restore (a TCP connect retried: ~10 s)
REPO = Path(__file__).resolve().parents[2]


def outcomes(directory: Path) -> list[dict[str, object]]:
    path = directory / "outcomes.jsonl"
    text = path.read_text() if path.is_file() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def wait_for(condition, timeout_s: float, what: str, directory: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                for p in sorted(directory.glob("*.log"))
            )
            raise AssertionError(f"no {what} in {timeout_s:g} s: {outcomes(directory)}\n{logs}")
        time.sleep(0.1)


def test_weights_flow_again_after_the_link_is_cut_mid_transfer_and_restored(
    tmp_path: Path,
) -> None:
    node = [sys.executable, "-m", "tests.support.weight_host_node"]
    with Hosts(2, shared=[tmp_path]) as hosts:
        hosts.start("h1", [*node, "publish", str(tmp_path)], log=tmp_path / "h1.log", cwd=REPO)
        hosts.start("h2", [*node, "receive", str(tmp_path)], log=tmp_path / "h2.log", cwd=REPO)
        got = lambda: [o for o in outcomes(tmp_path) if o["received"]]  # noqa: E731
        wait_for(lambda: got(), 90, "first version", tmp_path)
        # Slowed (a 2 MiB version takes 2 s) so that the cut comes mid-transfer.
        hosts.limit_rate("h2", "8mbit")
        time.sleep(1.0)
        hosts.cut_link("h2")
        time.sleep(CUT_S)
        hosts.restore_link("h2")
        hosts.clear_limit("h2")
        restored = time.time()
        wait_for(lambda: any(o["t"] > restored for o in got()), BACK_S, "version after", tmp_path)
    # The cut was felt: a fetch gave up on the source, and a later one dialled it again.
    assert any(not o["received"] and o["t"] < restored for o in outcomes(tmp_path))
