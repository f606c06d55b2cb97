"""The service brokers weight routes: announcements in, plans or clear errors out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.runtime.scheduler.service.service import SchedulerService
from asyncrl.transport import protocol as p

from .test_service import make, one_step

MANIFEST = {"buckets": [[0, 1 << 20], [1 << 20, 4096]], "sha256": ["aa", "bb"]}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[SchedulerService]:
    service = make(tmp_path)
    for name in ("gen-a", "gen-b", "gen-c"):
        assert isinstance(
            service.handle(p.Hello(name, "generate", p.PROTOCOL_VERSION, 1), 0.0), p.Ready
        )
    yield service
    service.durable.close()
    service.close_files()


def published(service: SchedulerService) -> None:
    one_step(service, "a")
    reply = service.handle(p.PublishVersion("train", 1, MANIFEST, b"tcp://trainer"), 0.0)
    assert reply == p.Ack()


def test_a_published_manifest_reaches_receivers_through_a_relay_tree(
    service: SchedulerService,
) -> None:
    published(service)
    a = service.handle(p.WantWeights("gen-a", 1, b"@a"), 0.0)
    assert a == p.WeightsPlan(1, MANIFEST, "train", b"tcp://trainer")
    b = service.handle(p.WantWeights("gen-b", 0, b"@b"), 0.0)
    assert (b.source, b.version) == ("train", 1)
    c = service.handle(p.WantWeights("gen-c", 0, b"@c"), 0.0)  # fan-out 2: gen-a relays
    assert isinstance(c, p.WeightsPlan) and (c.source, c.source_address) == ("gen-a", b"@a")
    assert service.handle(p.WantWeights("gen-c", 1), 0.0) == c  # asking again: the same
    weights = service.status(0.0)["weights"]
    assert weights["version"] == 1 and weights["publisher"] == "train"
    assert weights["tree"] == {"gen-a": "train", "gen-b": "train", "gen-c": "gen-a"}
    assert "buckets" not in json.dumps(service.status(0.0))  # the manifest is not shown


def test_a_failed_source_is_replaced_and_a_lost_one_leaves_the_tree(
    service: SchedulerService,
) -> None:
    published(service)
    for name in ("gen-a", "gen-b", "gen-c"):
        service.handle(p.WantWeights(name, 1, f"@{name}".encode()), 0.0)
    again = service.handle(p.WantWeights("gen-c", 1, b"@gen-c", failed="gen-a"), 0.0)
    assert isinstance(again, p.WeightsPlan) and again.source == "train"
    assert service.handle(p.Bye("gen-b", "done"), 0.0) == p.Ack()
    assert service.status(0.0)["weights"]["tree"] == {"gen-c": "train"}
    # Silent workers are lost by the clock; the trainer's loss takes its announcement.
    service.tick(1000.0)
    assert service.status(1000.0)["weights"] == {
        "version": None,
        "publisher": None,
        "relay_fanout": 2,
        "tree": {},
    }


def test_a_newer_version_supersedes_the_old_one(service: SchedulerService) -> None:
    published(service)
    one_step(service, "b")
    assert service.handle(p.PublishVersion("train", 2, {"v": 2}, b"T2"), 0.0) == p.Ack()
    old = service.handle(p.WantWeights("gen-a", 1), 0.0)
    assert isinstance(old, p.Error) and old.code == "bad_version"
    assert "version 1" in old.detail and "newest held is 2" in old.detail
    assert service.handle(p.WantWeights("gen-a", 0), 0.0).manifest == {"v": 2}


def test_a_restarted_trainer_announces_the_current_version_again(
    service: SchedulerService,
) -> None:
    published(service)
    again = p.PublishVersion("train", 1, {"again": 1}, b"tcp://new-trainer")
    assert service.handle(again, 0.0) == p.Ack()
    plan = service.handle(p.WantWeights("gen-a", 0), 0.0)
    assert isinstance(plan, p.WeightsPlan)
    assert plan.manifest == {"again": 1} and plan.source_address == b"tcp://new-trainer"
    # Without weights, the same version is still refused: versions only go forward.
    refused = service.handle(p.PublishVersion("train", 1), 0.0)
    assert isinstance(refused, p.Error) and refused.code == "bad_version"


def test_no_announcement_is_an_error_naming_the_version(service: SchedulerService) -> None:
    reply = service.handle(p.WantWeights("gen-a", 0), 0.0)
    assert isinstance(reply, p.Error) and reply.code == "bad_version"
    assert "version 0: none is held" in reply.detail
    one_step(service, "a")
    assert service.handle(p.PublishVersion("train", 1), 0.0) == p.Ack()  # files: no weights
    assert isinstance(service.handle(p.WantWeights("gen-a", 1), 0.0), p.Error)


@pytest.mark.parametrize(
    ("message", "code", "words"),
    [
        (p.WantWeights("gen-a", -1), "bad_request", "negative"),
        (p.WantWeights("ghost", 1), "unknown_worker", "ghost"),
        (p.WantWeights("gen-a", 1, failed="gen-a"), "bad_request", "itself"),
        (p.WantWeights("train", 1), "bad_request", "published version 1"),
        (p.PublishVersion("train", 2, None, b"T"), "bad_request", "no manifest"),
    ],
)
def test_bad_weights_requests_get_clear_errors(
    service: SchedulerService, message: p.Message, code: str, words: str
) -> None:
    published(service)
    one_step(service, "b")
    reply = service.handle(p.decode(p.encode(message)), 0.0)
    assert isinstance(reply, p.Error) and reply.code == code and words in reply.detail
    assert service.core.state.policy_version == 1  # a refused publication changed nothing
    assert service.routes.newest == 1


def test_a_manifest_that_is_not_a_dict_is_refused_not_a_crash(service: SchedulerService) -> None:
    one_step(service, "a")
    bad = p.PublishVersion("train", 1, ["not", "a", "dict"], b"T")  # type: ignore[arg-type]
    reply = service.handle(bad, 0.0)
    assert isinstance(reply, p.Error) and reply.code == "bad_request" and "manifest" in reply.detail
    assert service.core.state.policy_version == 0


def test_a_publication_the_core_refuses_announces_nothing(service: SchedulerService) -> None:
    one_step(service, "a")
    reply = service.handle(p.PublishVersion("gen-a", 1, MANIFEST, b"A"), 0.0)
    assert isinstance(reply, p.Error) and reply.code == "wrong_role"
    assert service.routes.newest is None


def test_weight_load_reports_go_to_their_file_and_into_each_step_line(
    tmp_path: Path, service: SchedulerService
) -> None:
    report = {"transfer_s": 0.5, "load_s": 0.25, "stall_s": 0.01, "bytes": 3_000_000}
    for name in ("gen-a", "gen-b"):
        data = {**report, "source": "train"}
        assert service.handle(p.Report(name, "weights", 1, data), 1.0) == p.Ack()
    service.handle(p.Report("gen-a", "weights", 1, {"transfer_s": 9.0}), 1.0)  # seen: dropped
    service.handle(p.Report("gen-b", "weights", 0, {"transfer_s": 7.0}), 1.0)  # older
    one_step(service, "a")
    lines = [json.loads(x) for x in (tmp_path / "weights.jsonl").read_text().splitlines()]
    assert [(x["worker"], x["version"]) for x in lines] == [
        ("gen-a", 1),
        ("gen-b", 1),
        ("gen-b", 0),
    ]
    assert lines[0]["source"] == "train" and lines[0]["elapsed_s"] == 1.0
    service.metrics.close()
    step = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert step["weights_version"] == 1
    assert (step["weights_transfer_s"], step["weights_load_s"]) == (0.5, 0.25)
    assert step["weights_stall_s"] == 0.01 and step["weights_mb_per_s"] == 6.0


def test_a_report_carries_only_what_it_measured(tmp_path: Path, service: SchedulerService) -> None:
    service.handle(p.Report("gen-a", "weights", 2, {"load_s": 0.1, "bytes": "many"}), 1.0)
    one_step(service, "a")
    service.metrics.close()
    step = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    weights = {k: v for k, v in step.items() if k.startswith("weights_")}
    assert weights == {"weights_version": 2, "weights_load_s": 0.1}


def test_a_restarted_scheduler_asks_the_trainer_to_announce_its_weights_again(
    tmp_path: Path,
) -> None:
    # Announcements are not journaled: without this a generator started after the
    # restart waits for weights until the trainer itself restarts or trains a step.
    first = make(tmp_path)
    first.handle(p.Hello("gen-a", "generate", p.PROTOCOL_VERSION, 1), 0.0)
    published(first)
    first.durable.close()
    first.close_files()
    again = make(tmp_path, resume=True)
    again.handle(p.Hello("gen-a", "generate", p.PROTOCOL_VERSION, 1), 0.0)
    again.take_events()
    refused = again.handle(p.WantWeights("gen-a", 0), 0.0)
    assert isinstance(refused, p.Error) and refused.code == "bad_version"
    wanted = [e for e in again.take_events() if e.topic == "version.wanted"]
    assert [e.body for e in wanted] == [{"version": 1}]
    assert again.handle(p.PublishVersion("train", 1, MANIFEST, b"tcp://trainer"), 0.0) == p.Ack()
    assert isinstance(again.handle(p.WantWeights("gen-a", 0), 0.0), p.WeightsPlan)
    assert not [e for e in again.take_events() if e.topic == "version.wanted"]
    again.durable.close()
    again.close_files()


def test_before_any_step_nobody_is_asked_for_weights(service: SchedulerService) -> None:
    assert isinstance(service.handle(p.WantWeights("gen-a", 0), 0.0), p.Error)
    assert not [e for e in service.take_events() if e.topic == "version.wanted"]
