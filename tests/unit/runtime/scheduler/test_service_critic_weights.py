"""The service routes the learned critic's weights beside the policy's: a critic's
announcement goes to routes of its own, a values worker's WantWeights is answered from
them (a generator's still from the policy's), and after a scheduler restart the critic
is asked to announce again (``version.critic_wanted``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from asyncrl.actors.worker.publishing import version_due
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.scheduler.service.assembly import open_service
from asyncrl.runtime.scheduler.service.service import SchedulerService
from asyncrl.transport import protocol as p

WORKERS = {"dl": "dataloader", "gen": "generate", "lp": "logp", "rw": "reward",
           "val-a": "values", "val-b": "values", "cr": "critic", "tr": "train"}  # fmt: skip
CRITIC = {"buckets": [[0, 4096]], "sha256": ["cc"], "names": ["score.weight"]}
POLICY = {"buckets": [[0, 8192]], "sha256": ["pp"]}


def make(tmp_path: Path, resume: bool = False) -> SchedulerService:
    cfg = config_from_dict(
        {
            "run": {"dir": str(tmp_path), "total_steps": 4},
            "algorithm": {"estimator": "gae"},
            "critic": {"values": "stage"},  # values workers that follow the critic
            "pipeline": {"train_batch_groups": 1},
        }
    )
    service = open_service(cfg, resume=resume, now=0.0)
    for worker, role in WORKERS.items():
        hello = p.Hello(worker, role, p.PROTOCOL_VERSION, 1)
        assert isinstance(service.handle(hello, 0.0), p.Ready)
    for worker in ("gen", "val-a", "val-b"):
        assert service.handle(p.LoadedVersion(worker, 0), 0.0) == p.Ack()
    return service


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SchedulerService]:
    service = make(tmp_path)
    yield service
    close(service)


def close(service: SchedulerService) -> None:
    service.durable.close()
    service.close_files()


def run(service: SchedulerService, worker: str, gid: int | None, data: dict) -> p.Message:
    """``worker`` claims one group's work and completes it with ``data``; the reply."""
    lease = service.handle(p.Claim(worker, WORKERS[worker], 1), 0.0)
    assert isinstance(lease, p.Lease), lease
    gid = lease.items[0].gid if gid is None else gid
    behaviour = (0, 0) if worker == "gen" else None
    results = (p.Result(gid, data, behaviour),)
    return service.handle(p.Complete(worker, lease.lease_id, lease.fence, results), 0.0)


def critic_step(service: SchedulerService, key: str) -> int:
    """One group generated, scored and taken by a critic step; its gid."""
    service.handle(p.AddGroups("dl", (p.NewGroup(key, {"x": 1}),)), 0.0)
    lease = service.handle(p.Claim("gen", "generate", 1), 0.0)
    assert isinstance(lease, p.Lease)
    gid = lease.items[0].gid
    done = (p.Result(gid, {"t": np.arange(3)}, (0, 0)),)
    assert service.handle(p.Complete("gen", lease.lease_id, lease.fence, done), 0.0) == p.Ack(1)
    for worker in ("lp", "rw", "val-a"):
        run(service, worker, gid, {WORKERS[worker]: 1.0})
    reply = run(service, "cr", gid, {})
    assert reply == p.StepDone(1, service.core.state.critic_steps_done)  # the one to publish
    return gid


def critic_published(service: SchedulerService, address: bytes = b"tcp://critic") -> None:
    critic_step(service, "a")
    assert service.handle(p.PublishVersion("cr", 1, CRITIC, address), 0.0) == p.Ack()


def test_a_critic_announcement_reaches_values_workers_and_not_generators(
    service: SchedulerService,
) -> None:
    with capture_logs() as logs:
        critic_published(service)
    (announced,) = [e for e in logs if e["event"] == "weights announced"]
    assert announced["critic"] is True and announced["publisher"] == "cr"
    assert service.critic_routes.newest == 1 and service.routes.newest is None
    plan = service.handle(p.WantWeights("val-a", 0, b"@val-a"), 0.0)
    assert plan == p.WeightsPlan(1, CRITIC, "cr", b"tcp://critic")
    relayed = service.handle(p.WantWeights("val-b", 1, b"@val-b"), 0.0)
    assert isinstance(relayed, p.WeightsPlan) and relayed.source == "cr"
    # The policy has no version with weights yet: a generator is not given the critic's.
    refused = service.handle(p.WantWeights("gen", 0, b"@gen"), 0.0)
    assert isinstance(refused, p.Error) and refused.code == "bad_version"
    summary = service.status(0.0)
    assert summary["critic"]["weights"]["tree"] == {"val-a": "cr", "val-b": "cr"}
    assert summary["weights"]["version"] is None


def test_the_policy_and_the_critic_each_route_their_own_versions(
    service: SchedulerService,
) -> None:
    critic_published(service)
    run(service, "tr", None, {})  # the policy's step 1, on the group the critic took
    with capture_logs() as logs:
        assert service.handle(p.PublishVersion("tr", 1, POLICY, b"tcp://trainer"), 0.0) == p.Ack()
    assert [e["critic"] for e in logs if e["event"] == "weights announced"] == [False]
    assert service.handle(p.WantWeights("gen", 0), 0.0) == p.WeightsPlan(
        1, POLICY, "tr", b"tcp://trainer"
    )
    assert service.handle(p.WantWeights("val-a", 0), 0.0) == p.WeightsPlan(
        1, CRITIC, "cr", b"tcp://critic"
    )
    summary = service.status(0.0)
    assert (summary["weights"]["publisher"], summary["critic"]["weights"]["publisher"]) == (
        "tr",
        "cr",
    )
    # A values worker never names a policy source as failed into the critic's tree.
    again = service.handle(p.WantWeights("val-a", 1, b"", failed="cr"), 0.0)
    assert isinstance(again, p.Error) and again.code == "no_source"
    assert service.routes.tree() == {"gen": "tr"}


def test_a_critic_announcing_its_version_again_replaces_its_route(
    service: SchedulerService,
) -> None:
    critic_published(service)
    again = p.PublishVersion("cr", 1, {**CRITIC, "again": 1}, b"tcp://new-critic")
    assert service.handle(again, 0.0) == p.Ack()
    plan = service.handle(p.WantWeights("val-a", 0), 0.0)
    assert isinstance(plan, p.WeightsPlan) and plan.source_address == b"tcp://new-critic"
    refused = service.handle(p.PublishVersion("cr", 1), 0.0)  # versions only go forward
    assert isinstance(refused, p.Error) and refused.code == "bad_version"
    assert service.core.state.critic_version == 1 and service.core.state.policy_version == 0


def test_a_lost_or_restarted_critic_takes_its_announcement_with_it(
    service: SchedulerService,
) -> None:
    critic_published(service)
    # A new critic process registers under the name: the old address may be dead, so the
    # announcement goes, and the status says the critic's version is due again.
    assert isinstance(service.handle(p.Hello("cr", "critic", p.PROTOCOL_VERSION, 2), 0.0), p.Ready)
    assert service.critic_routes.newest is None
    assert version_due(service.status(0.0), critic=True) == 1
    assert service.handle(p.PublishVersion("cr", 1, CRITIC, b"tcp://critic-2"), 0.0) == p.Ack()
    assert version_due(service.status(0.0), critic=True) is None
    assert service.handle(p.Bye("cr", "stopped"), 0.0) == p.Ack()
    assert service.status(0.0)["critic"]["weights"]["version"] is None


def test_a_restarted_scheduler_asks_the_critic_to_announce_its_weights_again(
    tmp_path: Path,
) -> None:
    # Announcements are not journaled: a values worker started after the restart would
    # wait for the critic's weights until the critic's next step otherwise.
    first = make(tmp_path)
    critic_published(first)
    close(first)
    again = make(tmp_path, resume=True)
    try:
        again.take_events()
        refused = again.handle(p.WantWeights("val-a", 0), 0.0)
        assert isinstance(refused, p.Error) and refused.code == "bad_version"
        topics = [(e.topic, e.body) for e in again.take_events()]
        assert ("version.critic_wanted", {"version": 1}) in topics
        assert not [t for t, _ in topics if t == "version.wanted"]  # the policy's is not
        assert version_due(again.status(0.0), critic=True) == 1  # what the critic checks
        announce = p.PublishVersion("cr", 1, CRITIC, b"tcp://critic")
        assert again.handle(announce, 0.0) == p.Ack()
        assert isinstance(again.handle(p.WantWeights("val-a", 0), 0.0), p.WeightsPlan)
        assert not [e for e in again.take_events() if e.topic.endswith("wanted")]
    finally:
        close(again)


def test_before_any_critic_version_nobody_is_asked_for_critic_weights(
    service: SchedulerService,
) -> None:
    assert isinstance(service.handle(p.WantWeights("val-a", 0), 0.0), p.Error)
    assert not [e for e in service.take_events() if e.topic.endswith("wanted")]
