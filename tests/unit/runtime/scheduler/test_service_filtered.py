"""Filtered groups through the scheduler service: a result's verdict, the counts in the
status and the step lines, and the run stopped once nothing carries signal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.scheduler.service.assembly import open_service
from asyncrl.runtime.scheduler.service.service import SchedulerService
from asyncrl.runtime.scheduler.status_text import render_status
from asyncrl.transport import protocol as p

from .test_service import ROLES


def make(tmp_path: Path, max_filtered_batches: int = 2) -> SchedulerService:
    rule = {"enabled": True, "max_filtered_batches": max_filtered_batches}
    cfg = config_from_dict(
        {
            "run": {"dir": str(tmp_path), "total_steps": 3},
            "pipeline": {"train_batch_groups": 1, "max_staleness": 4},
            "algorithm": {"kl_coef": 0.01, "filter_groups": rule},
        }
    )
    service = open_service(cfg, resume=False, now=0.0)
    for role in ROLES:
        assert isinstance(service.handle(p.Hello(role, role, p.PROTOCOL_VERSION, 1), 0.0), p.Ready)
    assert service.handle(p.LoadedVersion("generate", 0), 0.0) == p.Ack()
    return service


def one_group(service: SchedulerService, key: str, filtered: str | None) -> int:
    """Generate and score one group; the reward says whether it carries signal."""
    service.handle(p.AddGroups("dataloader", (p.NewGroup(key, {"x": 1}),)), 0.0)
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    gid = lease.items[0].gid
    done = (p.Result(gid, {"t": np.arange(3)}, (0, 0)),)
    assert service.handle(p.Complete("generate", lease.lease_id, lease.fence, done), 0.0)
    for role in ("logp", "ref_logp", "reward"):
        lease = service.handle(p.Claim(role, role, 1), 0.0)
        why = filtered if role == "reward" else None
        results = (p.Result(gid, {role: 1.0}, filtered=why),)
        reply = service.handle(p.Complete(role, lease.lease_id, lease.fence, results), 0.0)
        assert reply == p.Ack(1), reply
    return gid


def test_filtered_groups_are_counted_in_the_status_and_each_step_line(tmp_path: Path) -> None:
    service = make(tmp_path)
    one_group(service, "a", "task reward 0 for all 8 responses")
    gid = one_group(service, "b", None)
    status = service.status(0.0)
    assert status["groups"]["filtered"] == 1
    assert status["filtered"]["groups_filtered"] == 1
    assert (
        status["filtered"]["filtered_in_a_row"] == 0  # "b" was judged to carry signal
        and status["filtered"]["filtered_bound"] == 2
    )
    assert "filtered  1 groups (100.0% of those judged)" in render_status(status)
    lease = service.handle(p.Claim("train", "train", 1), 0.0)
    assert [item.gid for item in lease.items] == [gid]
    result = (p.Result(gid, {}),)
    service.handle(p.Complete("train", lease.lease_id, lease.fence, result, {"loss": 0.1}), 0.0)
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert line["groups_filtered"] == 1 and line["filtered_fraction"] == 0.5
    assert line["prompts_per_batch"] == 2.0  # two groups judged for the step's batch of one
    assert line["filtered_in_a_row"] == 0
    assert "2 prompts per trained batch" in render_status(service.status(0.0))


def test_past_the_bound_the_run_drains_and_says_why(tmp_path: Path) -> None:
    service = make(tmp_path, max_filtered_batches=2)
    for key in ("a", "b"):
        one_group(service, key, "task reward 1 for all 8 responses")
    assert service.failure is None and service.draining is None
    one_group(service, "c", "task reward 1 for all 8 responses")
    assert service.failure is not None
    assert service.failure.startswith("algorithm.filter_groups: 3 groups filtered in a row")
    assert service.draining == service.failure  # no new leases: the run ends
    status = service.status(0.0)
    assert status["run"]["failure"] == service.failure
    assert render_status(status).splitlines()[1] == f"stopping  {service.failure}"
