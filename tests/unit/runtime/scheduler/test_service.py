"""The scheduler service without sockets: each request's reply, the metrics file, drains."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.scheduler.service.assembly import StagesChanged, open_service
from asyncrl.runtime.scheduler.service.service import SchedulerService
from asyncrl.runtime.scheduler.status_text import render_status
from asyncrl.transport import protocol as p

ROLES = ("dataloader", "generate", "logp", "ref_logp", "reward", "train")


def make(
    tmp_path: Path, resume: bool = False, total_steps: int = 2, **pipeline: object
) -> SchedulerService:
    cfg = config_from_dict(
        {
            "run": {"dir": str(tmp_path), "total_steps": total_steps},
            "pipeline": {"train_batch_groups": 1, **pipeline},
            "algorithm": {"kl_coef": 0.01},  # every stage runs, ref_logp included
        }
    )
    service = open_service(cfg, resume=resume, now=0.0)
    for role in ROLES:
        assert isinstance(service.handle(p.Hello(role, role, p.PROTOCOL_VERSION, 1), 0.0), p.Ready)
    assert service.handle(p.LoadedVersion("generate", 0), 0.0) == p.Ack()
    return service


def one_step(service: SchedulerService, key: str, metrics: dict | None = None) -> None:
    service.handle(p.AddGroups("dataloader", (p.NewGroup(key, {"x": 1}),)), 0.0)
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    assert isinstance(lease, p.Lease)
    gid = lease.items[0].gid
    done = (p.Result(gid, {"t": np.arange(3)}, (0, 0)),)
    assert service.handle(p.Complete("generate", lease.lease_id, lease.fence, done), 0.0)
    reads = {"logp": {"generate"}, "ref_logp": {"generate"}, "reward": {"dataloader", "generate"}}
    for role in ("logp", "ref_logp", "reward"):
        lease = service.handle(p.Claim(role, role, 1), 0.0)
        assert set(lease.items[0].data) == reads[role]  # what the stage reads, no more
        results = (p.Result(gid, {role: 1.0}),)
        service.handle(p.Complete(role, lease.lease_id, lease.fence, results), 0.0)
    lease = service.handle(p.Claim("train", "train", 1), 0.0)
    assert isinstance(lease, p.Lease)
    assert lease.items[0].data["generate"]["t"].tolist() == [0, 1, 2]
    assert set(lease.items[0].data) == set(ROLES) - {"train", "dataloader"}
    result = (p.Result(gid, {}),)
    reply = service.handle(p.Complete("train", lease.lease_id, lease.fence, result, metrics), 0.0)
    assert reply == p.StepDone(1, service.core.state.steps_done)  # the version to publish


def test_without_a_kl_penalty_no_ref_logp_stage_runs_and_groups_join_without_it(
    tmp_path: Path,
) -> None:
    cfg = config_from_dict({"run": {"dir": str(tmp_path)}, "pipeline": {"train_batch_groups": 1}})
    service = open_service(cfg, resume=False, now=0.0)
    refused = service.handle(p.Hello("ref_logp", "ref_logp", p.PROTOCOL_VERSION, 1), 0.0)
    assert isinstance(refused, p.Error)
    for role in set(ROLES) - {"ref_logp"}:
        assert isinstance(service.handle(p.Hello(role, role, p.PROTOCOL_VERSION, 1), 0.0), p.Ready)
    service.handle(p.LoadedVersion("generate", 0), 0.0)
    service.handle(p.AddGroups("dataloader", (p.NewGroup("a", {"x": 1}),)), 0.0)
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    gid = lease.items[0].gid
    done = (p.Result(gid, {"t": np.arange(3)}, (0, 0)),)
    service.handle(p.Complete("generate", lease.lease_id, lease.fence, done), 0.0)
    for role in ("logp", "reward"):
        lease = service.handle(p.Claim(role, role, 1), 0.0)
        results = (p.Result(gid, {role: 1}),)
        service.handle(p.Complete(role, lease.lease_id, lease.fence, results), 0.0)
    lease = service.handle(p.Claim("train", "train", 1), 0.0)
    assert isinstance(lease, p.Lease)
    assert set(lease.items[0].data) == {"generate", "logp", "reward"}


def test_a_run_writes_one_metrics_line_per_step_and_then_shuts_workers_down(
    tmp_path: Path,
) -> None:
    service = make(tmp_path)
    one_step(service, "a", {"loss": 0.5})
    one_step(service, "b")
    assert service.finished
    assert isinstance(service.handle(p.Claim("generate", "generate", 1), 0.0), p.Shutdown)
    service.durable.close()
    service.metrics.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and lines[0]["loss"] == 0.5
    topics = [e.topic for e in service.take_events()]
    assert "transition.pending.generating" in topics and topics[-1] == "run.finished"


def test_the_status_shows_the_newest_steps_log_prob_gap(tmp_path: Path) -> None:
    service = make(tmp_path, total_steps=3)
    assert "mismatch" not in service.status(0.0)  # no step yet
    gap = {"logprob_mismatch_tokens": 7, "logprob_mismatch_mean": 1e-7}
    corrected = {
        f"{part}_{name}": value
        for part in ("offpolicy", "engine")
        for name, value in (
            ("weight_mean", 1.02),
            ("weight_max", 7.5),
            ("truncated_frac", 0.001),
            ("masked_frac", 0.25 if part == "engine" else 0.0),
            ("rejected_frac", 0.125 if part == "offpolicy" else 0.0),
        )
    }
    one_step(
        service,
        "a",
        {**gap, "logprob_mismatch_max": 3e-7, "logprob_mismatch_kl": 4e-15,
         "logprob_mismatch_log_ppl": -2e-8, **corrected},
    )  # fmt: skip
    lines = render_status(service.status(0.0)).splitlines()
    assert (
        "mismatch  step 1: |logp gap| mean 1.00e-07, max 3.00e-07, k3 KL 4.00e-15, log-ppl "
        "gap -2.00e-08 over 7 tokens" in lines
    )
    assert (
        "corrected step 1: off-policy weight mean 1.020 max 7.5 (0.1% truncated), 0.0% "
        "tokens masked, 12.5% sequences rejected; engine weight mean 1.020 max 7.5 (0.1% "
        "truncated), 25.0% tokens masked, 0.0% sequences rejected" in lines
    )
    one_step(service, "b", {"logprob_mismatch_tokens": 0})  # nothing of its version
    summary = service.status(0.0)
    assert summary["mismatch"] == {"step": 2, "logprob_mismatch_tokens": 0}
    lines = render_status(summary).splitlines()
    assert "mismatch  step 2: no token scored under the version that sampled it" in lines
    one_step(service, "c", {"loss": 1.0})  # a trainer that measures nothing: the newest stays
    assert service.status(0.0)["mismatch"]["step"] == 2


def test_metrics_lines_ahead_of_the_journal_are_cut_on_resume(tmp_path: Path) -> None:
    service = make(tmp_path)
    one_step(service, "a")
    service.durable.close()
    service.metrics.append({"step": 2, "note": "journal never got this step"})
    with open(tmp_path / "metrics.jsonl", "a") as torn:
        torn.write('{"step": 3, "tor')
    again = make(tmp_path, resume=True)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1]
    again.durable.close()


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (p.Hello("x", "generate", p.PROTOCOL_VERSION + 1, 1), "protocol"),
        (p.Hello("x", "painter", p.PROTOCOL_VERSION, 1), "wrong_role"),
        (p.Ack(), "bad_request"),
        (p.Claim("ghost", "logp", 1), "unknown_worker"),
        (p.Claim("logp", "logp", 0), "bad_request"),
        (p.Complete("logp", 99, 1, ()), "unknown_lease"),
        (p.AddGroups("logp", ()), "wrong_role"),
        (p.AddGroups("ghost", ()), "unknown_worker"),  # so a forgotten dataloader registers
        (p.Claim("ghost", "dataloader", 1), "unknown_worker"),
        (p.AddGroups("dataloader", (p.NewGroup("k", {}), p.NewGroup("k", {}))), "bad_request"),
        (p.PublishVersion("generate", 1), "wrong_role"),
        (p.Unlock("train", "gpu", 1), "unknown_resource"),
    ],
)
def test_bad_requests_get_errors_naming_the_problem(
    tmp_path: Path, message: p.Message, code: str
) -> None:
    service = make(tmp_path)
    reply = service.handle(message, 0.0)
    assert isinstance(reply, p.Error) and reply.code == code and reply.detail
    service.durable.close()


def test_known_keys_are_skipped_not_added_twice(tmp_path: Path) -> None:
    service = make(tmp_path)
    first = service.handle(p.AddGroups("dataloader", (p.NewGroup("a", {}),)), 0.0)
    assert first == p.Added(("a",), ())
    both = (p.NewGroup("a", {}), p.NewGroup("b", {}))
    assert service.handle(p.AddGroups("dataloader", both), 0.0) == p.Added(("b",), ("a",))
    service.durable.close()


def test_the_dataloader_is_asked_for_a_bounded_backlog(tmp_path: Path) -> None:
    service = make(tmp_path, max_staleness=1)  # backlog: 1 group x (1 + 2)
    assert service.handle(p.Claim("dataloader", "dataloader", 100), 0.0) == p.Want(2)  # 2 steps
    service.handle(p.AddGroups("dataloader", (p.NewGroup("a", {}),)), 0.0)
    assert service.handle(p.Claim("dataloader", "dataloader", 100), 0.0) == p.Want(1)
    service.durable.close()


def test_stop_drains_no_new_leases_but_results_still_land(tmp_path: Path) -> None:
    service = make(tmp_path)
    service.handle(p.AddGroups("dataloader", (p.NewGroup("a", {}),)), 0.0)
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    assert service.handle(p.Stop("maintenance"), 0.0) == p.Ack(1)
    assert not service.idle
    assert isinstance(service.handle(p.Claim("generate", "generate", 1), 0.0), p.Shutdown)
    done = (p.Result(lease.items[0].gid, {}, (0, 0)),)
    assert service.handle(p.Complete("generate", lease.lease_id, lease.fence, done), 0.0)
    assert service.idle
    service.durable.close()


def test_a_resume_that_would_change_the_stages_is_refused_naming_kl_coef(tmp_path: Path) -> None:
    service = make(tmp_path)  # started with kl_coef 0.01: ref_logp runs
    service.durable.close()
    service.close_files()
    cfg = config_from_dict({"run": {"dir": str(tmp_path)}})
    with pytest.raises(StagesChanged, match="kl_coef"):
        open_service(cfg, resume=True, now=0.0)


def test_a_rollback_cuts_the_lost_steps_lines_and_weights_and_says_so(tmp_path: Path) -> None:
    service = make(tmp_path, total_steps=3)
    one_step(service, "a", {"loss": 0.5})
    manifest = {"format": 1}
    assert service.handle(p.PublishVersion("train", 1, manifest, b"addr"), 0.0) == p.Ack()
    one_step(service, "b", {"loss": 0.4, "logprob_mismatch_tokens": 0})
    service.take_events()
    # A trainer that starts again learns where the run is, and finds its state older.
    ready = service.handle(p.Hello("train", "train", p.PROTOCOL_VERSION, 2), 0.0)
    assert isinstance(ready, p.Ready) and ready.steps_done == 2
    assert service.handle(p.Rewind("train", 0), 0.0) == p.Ack()
    assert service.core.state.steps_done == 0
    assert service.routes.newest is None  # version 1's weights are gone with it
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines == [] and "mismatch" not in service.status(0.0)  # nor its status line
    topics = [e.topic for e in service.take_events()]
    assert "version.rolled_back" in topics
    # the generator ran on version 0 only: it stays; the prompts come back to be trained again
    keys = sorted(g.key for g in service.core.state.groups.values())
    assert keys == ["a#rollback1", "b#rollback1"]
    refused = service.handle(p.Rewind("generate", 0), 0.0)
    assert isinstance(refused, p.Error) and refused.code == "wrong_role"


def test_a_claim_that_finds_nothing_is_woken_by_name_when_its_work_comes(
    tmp_path: Path,
) -> None:
    service = make(tmp_path)
    for role in ("logp", "reward"):  # nothing generated yet: both wait
        assert isinstance(service.handle(p.Claim(role, role, 1), 0.0), p.NoWork)
    service.take_events()
    service.handle(p.AddGroups("dataloader", (p.NewGroup("a", {}),)), 0.0)
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    assert not [e for e in service.take_events() if e.topic.startswith("wake.")]
    done = (p.Result(lease.items[0].gid, {"t": np.arange(3)}, (0, 0)),)
    service.handle(p.Complete("generate", lease.lease_id, lease.fence, done), 0.0)
    woken = [e.topic for e in service.take_events() if e.topic.startswith("wake.")]
    assert woken == ["wake.logp/", "wake.reward/"]  # the one group wakes each role once
    service.durable.close()


def _generated(lease: p.Lease) -> tuple[p.Result, ...]:
    return tuple(p.Result(item.gid, {"t": np.arange(3)}, (0, 0)) for item in lease.items)


def _add(service: SchedulerService, *keys: str) -> None:
    groups = tuple(p.NewGroup(k, {}) for k in keys)
    assert service.handle(p.AddGroups("dataloader", groups), 0.0) == p.Added(keys, ())


def test_a_complete_that_claims_next_gets_the_next_lease_as_its_reply(tmp_path: Path) -> None:
    service = make(tmp_path)
    _add(service, "a", "b")
    first = service.handle(p.Claim("generate", "generate", 1), 0.0)
    done = p.Complete("generate", first.lease_id, first.fence, _generated(first), claim_next=1)
    second = service.handle(done, 1.0)
    assert isinstance(second, p.Lease) and second.role == "generate"
    assert [i.key for i in (*first.items, *second.items)] == ["a", "b"]
    state = service.core.state
    assert first.lease_id not in state.leases  # the results were taken first
    assert state.leases[second.lease_id].worker == "generate"
    assert service.waiting.waiting("generate") == 0
    # Held like a Claim's: a heartbeat naming it renews it, its fence ends it.
    before = state.leases[second.lease_id].expires_at
    assert service.handle(p.Heartbeat("generate", (second.lease_id,)), 2.0) == p.Ack(1)
    assert state.leases[second.lease_id].expires_at > before
    stale = p.Complete("generate", second.lease_id, second.fence + 1, _generated(second))
    assert service.handle(stale, 2.0).code == "stale_fence"
    done = p.Complete("generate", second.lease_id, second.fence, _generated(second))
    assert service.handle(done, 2.0) == p.Ack(1)
    service.durable.close()


def test_a_complete_that_finds_nothing_next_waits_to_be_woken_by_name(tmp_path: Path) -> None:
    service = make(tmp_path)
    _add(service, "a")
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    done = p.Complete("generate", lease.lease_id, lease.fence, _generated(lease), claim_next=1)
    assert service.handle(done, 0.0) == p.Ack(1)  # taken; nothing more to generate
    assert service.waiting.waiting("generate") == 1  # queued, as after an empty Claim
    service.take_events()
    _add(service, "b")
    woken = [e.topic for e in service.take_events() if e.topic.startswith("wake.")]
    assert woken == ["wake.generate/"]
    service.durable.close()


def test_a_complete_that_claims_next_leaves_the_workers_other_leases_alone(
    tmp_path: Path,
) -> None:
    service = make(tmp_path, max_staleness=4)  # room to admit all five
    _add(service, "a", "b")
    first = service.handle(p.Claim("generate", "generate", 1), 0.0)
    other = service.handle(p.Claim("generate", "generate", 1), 0.0)
    _add(service, "c", "d", "e")
    done = p.Complete("generate", first.lease_id, first.fence, _generated(first), claim_next=2)
    both = service.handle(done, 0.0)
    assert isinstance(both, p.Lease) and [i.key for i in both.items] == ["c", "d"]
    held = {lid for lid, lease in service.core.state.leases.items() if lease.worker == "generate"}
    assert held == {other.lease_id, both.lease_id}
    service.durable.close()


@pytest.mark.parametrize("claim_next", [-1, 65_537, 2**63])
def test_a_bad_claim_next_is_refused_whole_naming_it(tmp_path: Path, claim_next: int) -> None:
    service = make(tmp_path)
    _add(service, "a", "b")
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    results = _generated(lease)
    bad = p.Complete("generate", lease.lease_id, lease.fence, results, claim_next=claim_next)
    refused = p.decode(p.encode(service.handle(p.decode(p.encode(bad)), 0.0)))
    assert isinstance(refused, p.Error) and refused.code == "bad_request"
    assert f"claim_next {claim_next}" in refused.detail
    assert lease.lease_id in service.core.state.leases  # nothing taken, nothing leased
    assert len(service.core.state.leases) == 1
    good = p.Complete("generate", lease.lease_id, lease.fence, results, claim_next=1)
    assert isinstance(service.handle(good, 0.0), p.Lease)  # and the scheduler goes on
    service.durable.close()


def test_a_loaded_version_that_claims_next_gets_a_lease_or_waits_to_be_woken(
    tmp_path: Path,
) -> None:
    """An idle worker that loaded a version claims with the report: one request, not two."""
    service = make(tmp_path)
    _add(service, "a")
    reply = service.handle(p.LoadedVersion("generate", 0, claim_next=1), 0.0)
    assert isinstance(reply, p.Lease) and [i.key for i in reply.items] == ["a"]
    assert service.core.state.leases[reply.lease_id].worker == "generate"
    assert service.handle(p.LoadedVersion("logp", 0, claim_next=1), 0.0) == p.Ack()
    assert service.waiting.waiting("logp") == 1  # queued, as after an empty Claim
    service.take_events()
    done = p.Complete("generate", reply.lease_id, reply.fence, _generated(reply))
    assert service.handle(done, 0.0) == p.Ack(1)
    woken = [e.topic for e in service.take_events() if e.topic.startswith("wake.")]
    assert woken == ["wake.logp/"]
    service.durable.close()


@pytest.mark.parametrize("claim_next", [-1, 65_537])
def test_a_loaded_version_with_a_bad_claim_is_refused_whole(
    tmp_path: Path, claim_next: int
) -> None:
    service = make(tmp_path)
    _add(service, "a")
    bad = p.LoadedVersion("logp", 0, claim_next=claim_next)
    refused = p.decode(p.encode(service.handle(p.decode(p.encode(bad)), 0.0)))
    assert isinstance(refused, p.Error) and refused.code == "bad_request"
    assert f"claim_next {claim_next}" in refused.detail
    assert service.core.state.indexes.versions["logp"][None] == 1  # nothing taken
    assert not service.core.state.leases
    service.durable.close()


def test_a_loaded_version_refused_claims_nothing(tmp_path: Path) -> None:
    service = make(tmp_path)
    _add(service, "a")
    refused = service.handle(p.LoadedVersion("generate", 7, claim_next=1), 0.0)
    assert isinstance(refused, p.Error)  # no such version published
    assert not service.core.state.leases
    service.durable.close()


def test_a_train_steps_complete_is_answered_step_done_whatever_it_claims(
    tmp_path: Path,
) -> None:
    """The trainer publishes the version its StepDone names before it claims again."""
    service = make(tmp_path, total_steps=3)
    one_step(service, "a")
    _add(service, "b")
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    service.handle(p.Complete("generate", lease.lease_id, lease.fence, _generated(lease)), 0.0)
    for role in ("logp", "ref_logp", "reward"):
        lease = service.handle(p.Claim(role, role, 1), 0.0)
        results = (p.Result(lease.items[0].gid, {role: 1.0}),)
        service.handle(p.Complete(role, lease.lease_id, lease.fence, results), 0.0)
    step = service.handle(p.Claim("train", "train", 1), 0.0)
    result = (p.Result(step.items[0].gid, {}),)
    done = p.Complete("train", step.lease_id, step.fence, result, claim_next=1)
    assert service.handle(done, 0.0) == p.StepDone(1, 2)
    assert not service.core.state.leases and service.waiting.waiting("train") == 0
    service.durable.close()
