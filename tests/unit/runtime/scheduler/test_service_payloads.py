"""The scheduler service and payload references: kept, handed out, lost, freed."""

from __future__ import annotations

from pathlib import Path

from asyncrl.runtime.scheduler.service.service import SchedulerService
from asyncrl.transport import protocol as p

from .test_service import make


def ref(holder: str, key: int, size: int = 8 << 20) -> p.PayloadRef:
    return p.PayloadRef(holder, "tcp://127.0.0.1:9", "store-" + holder, key, size, 1234)


def generated(service: SchedulerService, keys: list[str]) -> list[int]:
    groups = tuple(p.NewGroup(k, {"x": 1}) for k in keys)
    service.handle(p.AddGroups("dataloader", groups), 0.0)
    lease = service.handle(p.Claim("generate", "generate", len(keys)), 0.0)
    gids = [item.gid for item in lease.items]
    results = tuple(p.Result(g, {}, (0, 0), ref("generate", g + 1)) for g in gids)
    assert service.handle(p.Complete("generate", lease.lease_id, lease.fence, results), 0.0)
    return gids


def test_a_reference_is_kept_and_handed_on_never_the_bytes(tmp_path: Path) -> None:
    service = make(tmp_path, train_batch_groups=2)
    gids = generated(service, ["a", "b"])
    lease = service.handle(p.Claim("logp", "logp", 2), 0.0)
    for item, gid in zip(lease.items, gids, strict=True):
        assert item.refs == {"generate": ref("generate", gid + 1)}
        assert item.data == {}  # logp reads no prompt: the lease does not carry it
    service.durable.writer.flush()
    journal = b"".join(f.read_bytes() for f in tmp_path.glob("journal/*") if f.is_file())
    assert b"store-generate" in journal and len(journal) < 64 << 10  # 16 MiB referenced


def test_a_completion_may_not_reference_another_workers_store(tmp_path: Path) -> None:
    service = make(tmp_path)
    service.handle(p.AddGroups("dataloader", (p.NewGroup("a", {"x": 1}),)), 0.0)
    lease = service.handle(p.Claim("generate", "generate", 1), 0.0)
    forged = (p.Result(lease.items[0].gid, {}, (0, 0), ref("logp", 1)),)
    reply = service.handle(p.Complete("generate", lease.lease_id, lease.fence, forged), 0.0)
    assert isinstance(reply, p.Error) and reply.code == "bad_result"


def test_a_lost_rollout_is_generated_again_and_counted(tmp_path: Path) -> None:
    service = make(tmp_path, train_batch_groups=2, max_attempts=3)
    gids = generated(service, ["a", "b"])
    lease = service.handle(p.Claim("reward", "reward", 2), 0.0)
    lost = (p.LostPayload(gids[0], "generate", "holder did not answer"),)
    reply = service.handle(p.Fail("reward", lease.lease_id, lease.fence, None, "fetch", lost), 0.0)
    assert reply == p.Ack(2)
    again = service.handle(p.Claim("generate", "generate", 2), 0.0)
    assert [item.gid for item in again.items] == [gids[0]]
    status = service.status(0.0)
    assert status["regenerated"] == {"generate": 1}


def test_losing_an_inline_payload_is_refused(tmp_path: Path) -> None:
    service = make(tmp_path)
    gid = generated(service, ["a"])[0]
    lease = service.handle(p.Claim("logp", "logp", 1), 0.0)
    lost = (p.LostPayload(gid, "dataloader", "x"),)
    reply = service.handle(p.Fail("logp", lease.lease_id, lease.fence, None, "x", lost), 0.0)
    assert isinstance(reply, p.Error) and reply.code == "bad_request"


def test_held_keys_are_dropped_once_no_live_group_refers_to_them(tmp_path: Path) -> None:
    service = make(tmp_path, train_batch_groups=1)
    gid = generated(service, ["a"])[0]
    held = p.Held("generate", "store-generate", (gid + 1, 999), 123)
    assert service.handle(held, 0.0) == p.Drop((999,))  # 999 was never referenced
    assert service.status(0.0)["payload_stores"] == {"generate": {"payloads": 2, "bytes": 123}}
    for role in ("logp", "ref_logp", "reward"):
        lease = service.handle(p.Claim(role, role, 1), 0.0)
        service.handle(p.Complete(role, lease.lease_id, lease.fence, (p.Result(gid, {}),)), 0.0)
    assert service.handle(held, 0.0) == p.Drop((999,))  # the trainer has not read it yet
    lease = service.handle(p.Claim("train", "train", 1), 0.0)
    service.handle(p.Complete("train", lease.lease_id, lease.fence, (p.Result(gid, {}),)), 0.0)
    assert service.handle(held, 0.0) == p.Drop((gid + 1, 999))  # trained: free it


def test_a_lease_carries_only_what_its_stage_reads_and_a_loss_of_it_is_taken(
    tmp_path: Path,
) -> None:
    service = make(tmp_path, train_batch_groups=2, max_attempts=3)
    gids = generated(service, ["a", "b"])
    lease = service.handle(p.Claim("logp", "logp", 2), 0.0)
    results = tuple(p.Result(g, {}, None, ref("logp", 100 + g)) for g in gids)
    service.handle(p.Complete("logp", lease.lease_id, lease.fence, results), 0.0)
    reward = service.handle(p.Claim("reward", "reward", 2), 0.0)
    for item in reward.items:  # the prompt and the rollouts; never logp's bytes
        assert set(item.data) == {"dataloader"} and set(item.refs) == {"generate"}
    named = (p.LostPayload(gids[0], "logp", "holder gone"),)
    fail = p.Fail("reward", reward.lease_id, reward.fence, None, "fetch", named)
    refused = service.handle(fail, 0.0)
    assert isinstance(refused, p.Error) and "carries no logp payload" in refused.detail
    carried = (p.LostPayload(gids[0], "generate", "holder gone"),)
    fail = p.Fail("reward", reward.lease_id, reward.fence, None, "fetch", carried)
    assert service.handle(fail, 0.0) == p.Ack(2)  # at once: no lease is left to run out
    assert service.core.state.leases == {}


def test_a_payload_kept_by_a_process_that_is_gone_is_made_again_uncounted(
    tmp_path: Path,
) -> None:
    service = make(tmp_path, train_batch_groups=2, max_attempts=1)
    gids = generated(service, ["a", "b"])
    # the generator is killed and starts again: a new process, whose store is not the old
    restarted = p.Hello("generate", "generate", p.PROTOCOL_VERSION, 2)
    assert isinstance(service.handle(restarted, 0.0), p.Ready)
    lease = service.handle(p.Claim("reward", "reward", 2), 0.0)
    lost = (p.LostPayload(gids[0], "generate", "holder did not answer"),)
    reply = service.handle(p.Fail("reward", lease.lease_id, lease.fence, None, "fetch", lost), 0.0)
    assert reply == p.Ack(2)
    group = service.core.state.groups[gids[0]]
    assert group.state == "pending" and group.attempts == {}  # max_attempts 1, yet alive
    assert service.status(0.0)["regenerated"] == {"generate": 1}


def second_generator(service: SchedulerService) -> None:
    assert isinstance(service.handle(p.Hello("gen-b", "generate", p.PROTOCOL_VERSION, 7), 0.0),
                      p.Ready)  # fmt: skip
    assert service.handle(p.LoadedVersion("gen-b", 0), 0.0) == p.Ack()


def generated_by(service: SchedulerService, worker: str, key: str) -> int:
    service.handle(p.AddGroups("dataloader", (p.NewGroup(key, {"x": 1}),)), 0.0)
    lease = service.handle(p.Claim(worker, "generate", 1), 0.0)
    assert isinstance(lease, p.Lease), lease
    (gid,) = [item.gid for item in lease.items]
    result = (p.Result(gid, {}, (0, 0), ref(worker, gid + 1)),)
    assert service.handle(p.Complete(worker, lease.lease_id, lease.fence, result), 0.0)
    return gid


def test_a_lease_never_names_a_holder_that_left(tmp_path: Path) -> None:
    service = make(tmp_path, train_batch_groups=2, max_attempts=1)
    second_generator(service)
    kept, lost = generated_by(service, "generate", "a"), generated_by(service, "gen-b", "b")
    assert service.handle(p.Bye("gen-b", "stopped"), 0.0)
    lease = service.handle(p.Claim("reward", "reward", 2), 0.0)
    assert [item.gid for item in lease.items] == [kept]
    assert [ref.holder for item in lease.items for ref in item.refs.values()] == ["generate"]
    group = service.core.state.groups[lost]
    assert group.state == "pending" and group.attempts == {}  # max_attempts 1, yet alive
    assert service.status(0.0)["regenerated"] == {"generate": 1}


def test_a_holder_that_came_back_as_a_new_process_is_not_named_either(tmp_path: Path) -> None:
    service = make(tmp_path, train_batch_groups=2)
    gids = generated(service, ["a", "b"])
    assert isinstance(service.handle(p.Hello("generate", "generate", p.PROTOCOL_VERSION, 9), 0.0),
                      p.Ready)  # fmt: skip
    # Not known yet whose store is whose: the lease goes out, its reader finds out.
    lease = service.handle(p.Claim("logp", "logp", 2), 0.0)
    assert [item.gid for item in lease.items] == gids
    assert service.handle(p.Fail("logp", lease.lease_id, lease.fence, None, "stop"), 0.0)
    # The new process says what it keeps: a store of its own, so the old one is gone.
    assert service.handle(p.Held("generate", "store-generate-2", (), 0), 0.0) == p.Drop(())
    assert isinstance(service.handle(p.Claim("logp", "logp", 2), 0.0), p.NoWork)
    assert all(service.core.state.groups[g].state == "pending" for g in gids)
    assert service.core.state.leases == {}


def test_a_train_batch_with_a_gone_holder_goes_back_whole(tmp_path: Path) -> None:
    service = make(tmp_path, train_batch_groups=2, max_attempts=1)
    second_generator(service)
    gids = [generated_by(service, "generate", "a"), generated_by(service, "gen-b", "b")]
    for role in ("logp", "ref_logp", "reward"):
        lease = service.handle(p.Claim(role, role, 2), 0.0)
        done = tuple(p.Result(g, {}) for g in gids)
        assert service.handle(p.Complete(role, lease.lease_id, lease.fence, done), 0.0)
    assert service.handle(p.Bye("gen-b", "stopped"), 0.0)
    assert isinstance(service.handle(p.Claim("train", "train", 1), 0.0), p.NoWork)
    assert service.core.state.leases == {}
    states = {g: service.core.state.groups[g].state for g in gids}
    assert states == {gids[0]: "ready", gids[1]: "pending"}
