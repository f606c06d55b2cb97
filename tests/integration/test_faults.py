"""Faults with real processes and sockets: kill -9, restarts, stale fences, CURVE.

Each test runs the demo pipeline (exact results per group, see
tests/support/demo_pipeline.py) through a real scheduler process and real worker
processes, breaks something, and checks that the run still ends with every group's result
exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.transport import protocol as p
from asyncrl.transport.link import LinkTimeout
from asyncrl.transport.security import keygen
from asyncrl.transport.zmq_link import ZmqLink
from tests.support.cluster import ROLES, Cluster, listening_port, wait_for
from tests.support.runlink import run_link

pytestmark = pytest.mark.timeout(120)


def link_to(
    c: Cluster, name: str, role: str | None = None, keys_dir: Path | None = None
) -> ZmqLink:
    """A link as worker ``name`` of ``role`` (None: an observer), with the run's bus keys
    or those in ``keys_dir``."""
    return run_link(c.run_dir, name, role, keys_dir=keys_dir)


def test_a_killed_workers_lease_is_redelivered_and_every_result_arrives_once(cluster) -> None:
    c: Cluster = cluster(run={"total_steps": 6})
    c.scheduler()
    for role in ROLES:
        if role != "generate":
            c.worker(role)
    c.worker("generate", 0, env={"ASYNCRL_DEMO_WORK_S": "generate=30"})  # holds its lease

    def generate_leased() -> bool:
        with link_to(c, "observer") as link:
            status = link.request(p.Status(), 5)
        return isinstance(status, p.StatusReply) and status.summary["leases"].get("generate")

    wait_for(generate_leased, 30, "a generate lease")
    c.kill9("generate-0")
    c.worker("generate", 1)
    assert c.wait("scheduler", 90) == 0
    c.check_exactly_once()
    log = c.log_text("scheduler")
    assert '"worker lost"' in log and "generate-0" in log and "groups went back" in log


def test_requests_a_second_client_makes_for_live_workers_are_refused(cluster) -> None:
    c: Cluster = cluster(run={"total_steps": 8})
    c.scheduler()
    c.all_workers(env={"ASYNCRL_DEMO_WORK_S": "generate=0.2"})
    wait_for(lambda: c.steps_done() >= 1, 60, "a train step")
    forged: list[p.Message] = [
        p.Report("generate-0", "validation", 1, {"val_reward": 0.0}),
        p.Bye("logp-0", "forged"),
        p.Hello("ref_logp-0", "reward", p.PROTOCOL_VERSION, 1),
        # Lease ids as fences, every lease so far, as a guesser would try them.
        *(p.Fail("generate-0", n, n, None, "forged") for n in range(1, 40)),
    ]
    with link_to(c, "intruder") as link:
        for message in forged:
            reply = link.request(message, 5)
            assert isinstance(reply, p.Error) and reply.code == "wrong_sender", reply
    assert c.wait("scheduler", 90) == 0
    c.check_exactly_once()
    refused = c.log_text("scheduler").count('"request refused"')
    assert refused == len(forged)


def test_a_scheduler_killed_mid_run_resumes_and_the_run_ends_exact(cluster) -> None:
    c: Cluster = cluster(
        run={"total_steps": 12},
        scheduler={"control_port": listening_port(), "events_port": listening_port()},
    )
    c.scheduler()
    c.all_workers(env={"ASYNCRL_DEMO_WORK_S": "train=0.2,generate=0.05"})
    wait_for(lambda: c.steps_done() >= 3, 60, "three train steps")
    c.kill9("scheduler")
    c.scheduler(resume=True)
    assert c.wait("scheduler", 90) == 0
    c.check_exactly_once()
    for role in ROLES:  # the workers found the new scheduler by themselves and left cleanly
        assert c.wait(f"{role}-0", 30) == 0


def test_a_completion_after_its_lease_was_reissued_is_refused_by_its_fence(cluster) -> None:
    c: Cluster = cluster(pipeline={"lease_timeout_s": 0.5, "train_batch_groups": 1})
    c.scheduler()
    with (
        link_to(c, "loader", "dataloader") as loader,
        link_to(c, "slow", "generate") as slow,
        link_to(c, "fast", "generate") as fast,
    ):
        loader.request(p.Hello("loader", "dataloader", p.PROTOCOL_VERSION, 1), 5)
        loader.request(p.AddGroups("loader", (p.NewGroup("q000000", {"x": 0}),)), 5)
        for link, name in ((slow, "slow"), (fast, "fast")):
            assert isinstance(
                link.request(p.Hello(name, "generate", p.PROTOCOL_VERSION, 1), 5), p.Ready
            )
            link.request(p.LoadedVersion(name, 0), 5)
        first = slow.request(p.Claim("slow", "generate", 1), 5)
        assert isinstance(first, p.Lease)

        def reissued() -> p.Message | None:
            lease = fast.request(p.Claim("fast", "generate", 1), 5)
            return lease if isinstance(lease, p.Lease) else None

        second = wait_for(reissued, 10, "the expired lease's group to be leased again")
        assert second.items[0].gid == first.items[0].gid
        result = (p.Result(first.items[0].gid, {"tokens": []}, (0, 0)),)
        late = slow.request(p.Complete("slow", first.lease_id, first.fence, result), 5)
        assert isinstance(late, p.Error) and late.code == "stale_fence"
        ok = fast.request(p.Complete("fast", second.lease_id, second.fence, result), 5)
        assert ok == p.Ack(1)
        status = fast.request(p.Status(), 5)
        assert status.summary["refused"]["stale_fence"] == 1


def test_with_curve_a_client_without_the_key_never_gets_a_lease(cluster, tmp_path: Path) -> None:
    keys, stranger = tmp_path / "keys", tmp_path / "stranger"
    keygen(keys)
    keygen(stranger)
    c: Cluster = cluster(scheduler={"curve": "on", "keys_dir": str(keys)})
    c.scheduler()
    assert c.endpoints()["curve"] is True
    with link_to(c, "intruder", "generate", stranger) as intruder:
        with pytest.raises(LinkTimeout):
            intruder.request(p.Hello("intruder", "generate", p.PROTOCOL_VERSION, 1), 2)
        with pytest.raises(LinkTimeout):
            intruder.request(p.Claim("intruder", "generate", 1), 1)
    where = c.endpoints()
    plain = ZmqLink(where["control"], where["events"], identity="plain")  # no keys at all
    with plain, pytest.raises(LinkTimeout):
        plain.request(p.Status(), 2)
    with link_to(c, "member", "logp", keys) as member:
        assert isinstance(
            member.request(p.Hello("member", "logp", p.PROTOCOL_VERSION, 1), 5), p.Ready
        )
        summary = member.request(p.Status(), 5).summary
    assert set(summary["workers"]) == {"member"}
    wait_for(lambda: "client rejected" in c.log_text("scheduler"), 10, "the refusal in the log")
    assert "secret" not in c.log_text("scheduler").lower()


def test_status_and_stop_from_another_process(cluster) -> None:
    c: Cluster = cluster(run={"total_steps": 1000})
    c.scheduler()
    c.all_workers(env={"ASYNCRL_DEMO_WORK_S": "train=0.1"})
    wait_for(lambda: c.steps_done() >= 2, 60, "two train steps")
    config = ["-c", str(c.config_path)]
    c.spawn("status", ["asyncrl.runtime.scheduler.cli", "status", "--json", *config])
    assert c.wait("status", 30) == 0
    summary = json.loads(c.log_text("status"))
    assert {w["role"] for w in summary["workers"].values()} == set(ROLES)
    c.spawn("stop", ["asyncrl.runtime.scheduler.cli", "stop", *config])
    assert c.wait("stop", 30) == 0
    assert c.wait("scheduler", 60) == 0
    for role in ROLES:
        assert c.wait(f"{role}-0", 30) == 0
    steps = c.steps_done()
    assert 2 <= steps < 1000
    lines = c.metrics()
    assert [line["step"] for line in lines] == list(range(1, steps + 1))


def test_with_groups_filtered_a_scheduler_and_a_scorer_killed_leave_each_group_once(
    cluster,
) -> None:
    # The demo's reward filters every third group: the killed scheduler resumes from a
    # journal holding filtered groups, and a logp worker killed mid-lease leaves its
    # groups, some filtered meanwhile, to be taken again; each group is trained, filtered
    # or dead once, and no filtered one trained (check_exactly_once).
    c: Cluster = cluster(
        run={"total_steps": 10},
        algorithm={"kl_coef": 0.01, "filter_groups": {"enabled": True}},
        scheduler={"control_port": listening_port(), "events_port": listening_port()},
    )
    c.scheduler()
    c.all_workers(env={"ASYNCRL_DEMO_WORK_S": "train=0.2,generate=0.05,logp=0.1"})
    wait_for(lambda: c.steps_done() >= 3, 60, "three train steps")
    c.kill9("scheduler")
    c.scheduler(resume=True)
    c.kill9("logp-0")
    c.worker("logp", 1)
    assert c.wait("scheduler", 90) == 0
    c.check_exactly_once()
