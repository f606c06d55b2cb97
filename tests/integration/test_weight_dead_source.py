"""A UCX weight source on another host dies (its host killed) in the middle of a transfer:
the receiver gives up on it at its stall timeout and no later, because closing its endpoint
cancels the receives it had posted at once. Closing alone left them posted for as long as
UCX could not flush the endpoint to the dead peer over TCP, and the fetch waited 5 s more
for them before it said the source was lost."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_weight_link_cut import REPO, outcomes, wait_for
from tests.support.hosts import Hosts, hosts_available, why_no_hosts

pytestmark = [
    pytest.mark.skipif(not hosts_available(), reason=str(why_no_hosts())),
    pytest.mark.timeout(120),
]

STALL_S = 2.0  # the receiver's stall timeout (weight_host_node's default)
MARGIN_S = 2.0  # the range in flight's own deadline began a little before the kill


def test_a_receive_from_a_dead_source_ends_at_the_stall_timeout(tmp_path: Path) -> None:
    node = [sys.executable, "-m", "tests.support.weight_host_node"]
    env = {**os.environ, "WEIGHT_NODE_STALL_S": str(STALL_S)}
    with Hosts(2, shared=[tmp_path]) as hosts:
        hosts.start("h1", [*node, "publish", str(tmp_path)], log=tmp_path / "h1.log", cwd=REPO)
        hosts.start(
            "h2", [*node, "receive", str(tmp_path)], log=tmp_path / "h2.log", cwd=REPO, env=env
        )
        wait_for(lambda: any(o["received"] for o in outcomes(tmp_path)), 90, "a version", tmp_path)
        hosts.limit_rate("h2", "8mbit")  # a 2 MiB version takes 2 s: the kill comes mid-way
        time.sleep(1.0)
        hosts.kill_host("h1")
        killed = time.time()
        lost = lambda: [o for o in outcomes(tmp_path) if not o["received"] and o["t"] > killed]  # noqa: E731
        wait_for(lambda: lost(), STALL_S + 15, "lost source", tmp_path)
        assert lost()[0]["t"] - killed < STALL_S + MARGIN_S, lost()
