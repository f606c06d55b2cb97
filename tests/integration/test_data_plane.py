"""The data plane under faults, with real processes: holders killed, frozen, restarted.

Every result of the demo pipeline travels by reference here (the cluster sets
``payloads.inline_bytes=0``), so each consumer fetches from the worker that made it. A
holder that dies takes with it what nobody had consumed yet: those payloads are made again
(counted), and the run still ends with every group's exact result once.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.cluster import ROLES, Cluster, free_port, wait_for

pytestmark = pytest.mark.timeout(150)


def unconsumed_rollouts(c: Cluster) -> bool:
    """Groups are generated and waiting for their readers: held by the generator alone."""
    return c.status()["groups"].get("generated", 0) >= 2


def start(c: Cluster, slow: str) -> None:
    c.scheduler()
    for role in ROLES:
        c.worker(role, env={"ASYNCRL_DEMO_WORK_S": slow})


def replace_the_generator(c: Cluster) -> str:
    """Kill generate-0, start generate-1; the run must end exact. The scheduler's log."""
    c.kill9("generate-0")
    c.worker("generate", 1)
    assert c.wait("scheduler", 120) == 0
    c.check_exactly_once()
    return c.log_text("scheduler")


def test_a_killed_holder_s_unconsumed_payloads_are_made_again_and_counted(cluster) -> None:
    c: Cluster = cluster(run={"total_steps": 8}, pipeline={"max_staleness": 3})
    start(c, "logp=0.4,ref_logp=0.4,reward=0.4")  # rollouts wait for their readers
    wait_for(lambda: unconsumed_rollouts(c), 60, "rollouts not yet read")
    log = replace_the_generator(c)
    assert c.metrics()[-1]["payloads_regenerated"] >= 1
    assert '"payload lost"' in log and '"holder": "generate-0"' in log


def test_a_reader_whose_holder_dies_mid_fetch_reports_it_and_the_run_ends_exact(cluster) -> None:
    # Over ZeroMQ: a reader that maps a payload from shared memory keeps its pages even
    # when the holder dies, so only a fetch can be cut off.
    c: Cluster = cluster(
        run={"total_steps": 8},
        pipeline={"max_staleness": 3},
        payloads={"shared_memory": False},
    )
    start(c, "logp=0.3,ref_logp=0.3,reward=0.3")
    wait_for(lambda: unconsumed_rollouts(c), 60, "rollouts not yet read")
    c.signal("generate-0", signal.SIGSTOP)  # readers' requests now wait on it
    time.sleep(1.0)
    log = replace_the_generator(c)
    assert "did not answer" in log or "no connection to its holder" in log


def test_a_restarted_scheduler_finds_the_payloads_still_with_their_holders(cluster) -> None:
    c: Cluster = cluster(
        run={"total_steps": 10},
        pipeline={"max_staleness": 3},
        scheduler={"control_port": free_port(), "events_port": free_port()},  # dialled again
    )
    start(c, "train=0.2,logp=0.1")
    wait_for(lambda: c.steps_done() >= 2 and unconsumed_rollouts(c), 60, "work in flight")
    c.kill9("scheduler")
    c.scheduler(resume=True)
    assert c.wait("scheduler", 120) == 0
    c.check_exactly_once()
    assert c.metrics()[-1]["payloads_regenerated"] == 0  # nothing was lost with it
