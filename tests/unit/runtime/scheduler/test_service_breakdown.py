"""The service's step lines: where each role's time went and each step's critical path,
on times the test chooses (the service takes ``now`` with every request)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asyncrl.runtime.contract.bus import ACTIVITY_KEY, TimeBucket
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.scheduler.service.assembly import open_service
from asyncrl.runtime.scheduler.service.service import SchedulerService
from asyncrl.transport import protocol as p

WORKERS = {"dataloader": "dataloader", "gen-a": "generate", "gen-b": "generate", "logp": "logp",
           "ref_logp": "ref_logp", "reward": "reward", "train": "train"}  # fmt: skip


def activity(tokens: int = 0, **seconds: float) -> dict:
    us = [0] * len(TimeBucket)
    for name, s in seconds.items():
        us[TimeBucket[name.upper()]] = round(s * 1e6)
    return {ACTIVITY_KEY: {"tokens": tokens, "us": us}}


@pytest.fixture
def service(tmp_path: Path) -> SchedulerService:
    cfg = config_from_dict(
        {
            "run": {"dir": str(tmp_path), "total_steps": 3},
            "pipeline": {"train_batch_groups": 2, "max_staleness": 1},
            "algorithm": {"kl_coef": 0.01},  # every stage runs, ref_logp included
        }
    )
    service = open_service(cfg, resume=False, now=0.0)
    for name, role in WORKERS.items():
        assert isinstance(service.handle(p.Hello(name, role, p.PROTOCOL_VERSION, 1), 0.0), p.Ready)
    for generator in ("gen-a", "gen-b"):
        assert service.handle(p.LoadedVersion(generator, 0), 0.0) == p.Ack()
    return service


def complete(service: SchedulerService, worker: str, now: float, n: int, **seconds: float):
    role = WORKERS[worker]
    lease = service.handle(p.Claim(worker, role, n), now)
    assert isinstance(lease, p.Lease), lease
    gids = [item.gid for item in lease.items]
    if role == "generate":
        version = (lease.version, lease.version)
        results = tuple(p.Result(g, {"t": np.arange(3)}, version) for g in gids)
    else:
        results = tuple(p.Result(g, {role: 1.0}) for g in gids)
    metrics = activity(tokens=10 * len(gids), **seconds)
    reply = service.handle(p.Complete(worker, lease.lease_id, lease.fence, results, metrics), now)
    assert isinstance(reply, p.Ack | p.StepDone), reply
    return reply


def a_batch(service: SchedulerService, keys: str, t: float) -> None:
    """Two groups through every stage but training: group 1 ready at t+4, group 2 at t+5."""
    service.handle(p.AddGroups("dataloader", tuple(p.NewGroup(k, {"x": 1}) for k in keys)), t)
    complete(service, "gen-a", t + 1, 2, compute=0.6, scheduler=0.2, payloads=0.2)
    complete(service, "logp", t + 2, 2, compute=1.0)
    complete(service, "ref_logp", t + 3, 2, compute=1.0)
    complete(service, "reward", t + 4, 1, compute=0.5, waiting_for_work=0.5)
    complete(service, "reward", t + 5, 1, compute=0.5, waiting_for_work=0.5)


def lines(service: SchedulerService) -> list[dict]:
    service.metrics.close()
    return [json.loads(x) for x in service.metrics.path.read_text().splitlines()]


def test_each_step_line_has_its_critical_path_and_later_ones_the_load_by_every_generator(
    service: SchedulerService,
) -> None:
    a_batch(service, "ab", 0.0)  # batch ready at 5
    reply = complete(service, "train", 5.5, 2, compute=2.0)  # leased at 5.5, trained at 5.5
    assert reply == p.StepDone(2, 1)
    assert service.handle(p.PublishVersion("train", 1), 6.0) == p.Ack()
    service.handle(p.LoadedVersion("gen-a", 1), 6.25)
    a_batch(service, "cd", 10.0)  # batch ready at 15
    service.handle(p.LoadedVersion("gen-b", 1), 16.0)  # now every generator runs version 1
    lease = service.handle(p.Claim("train", "train", 2), 17.0)
    assert isinstance(lease, p.Lease)
    results = tuple(p.Result(item.gid, {}) for item in lease.items)
    done = p.Complete("train", lease.lease_id, lease.fence, results, activity(compute=1))
    assert service.handle(done, 20.0) == p.StepDone(2, 2)
    first, second = lines(service)
    assert first["critical_path"] == {"ready_to_leased_s": 0.5, "leased_to_trained_s": 0.0}
    assert "versions_loaded" not in first
    assert second["critical_path"] == {
        "ready_to_leased_s": 2.0,
        "trainer_busy_s": 0.0,  # it published version 1 at 6, long before the batch
        "leased_to_trained_s": 3.0,
    }
    assert second["versions_loaded"] == [
        {"step": 1, "trained_to_published_s": 0.5, "published_to_loaded_s": 10.0}
    ]


def test_each_roles_shares_add_up_to_one(service: SchedulerService) -> None:
    a_batch(service, "ab", 0.0)
    complete(service, "train", 6.0, 2, compute=3.0, weights=0.5, scheduler=0.5)
    (line,) = lines(service)
    roles = line["roles"]
    assert set(roles) == {"generate", "logp", "ref_logp", "reward", "train"}
    assert roles["generate"]["workers"] == 2
    assert roles["reward"]["waiting_for_work"] == 0.5
    assert roles["train"]["weights"] == 0.125 and roles["train"]["reported_s"] == 4.0
    for role, shares in roles.items():
        assert sum(shares[b.key] for b in TimeBucket) == pytest.approx(1.0), role
