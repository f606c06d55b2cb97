"""What a worker's Completes say about where its time went (against a scripted scheduler)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from asyncrl.actors.actor import Outcome
from asyncrl.runtime.contract.bus import ACTIVITY_KEY, TimeBucket
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from asyncrl.transport import protocol as p
from tests.support.demo_pipeline import Generate, Logp, Train

from .test_worker import ScriptedLink, lease, make_worker, train_step


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return config_from_dict({"run": {"dir": str(tmp_path / "run")}})


def seconds(complete: p.Complete) -> dict[str, float]:
    assert complete.metrics is not None
    us = complete.metrics[ACTIVITY_KEY]["us"]
    return {b.key: us[b] / 1e6 for b in TimeBucket}


class SlowLogp(Logp):
    def process(self, lease: p.Lease) -> Outcome:
        time.sleep(0.03)
        return super().process(lease)


def test_the_buckets_cover_the_loops_wall_time_and_empty_claims_are_waiting(
    cfg: RunConfig,
) -> None:
    link = ScriptedLink({p.Claim: [p.NoWork("idle"), p.NoWork("idle"), lease(1, 7), lease(2, 8)]})
    sent_at: list[tuple[type, float]] = []
    link.on_request = lambda m: sent_at.append((type(m), time.perf_counter()))
    started = time.perf_counter()
    assert make_worker(SlowLogp(), link, cfg).run() == 0
    first, second = (seconds(c) for c in link.of(p.Complete))
    assert first["waiting_for_work"] >= 0.02  # two claims that found nothing, two idle polls
    assert first["compute"] >= 0.03 and second["compute"] >= 0.03
    assert first["scheduler"] > 0  # the claim that brought the lease
    assert second["scheduler"] > 0  # the first Complete's round trip, and the next claim
    first_claim = next(t for kind, t in sent_at if kind is p.Claim)
    last_complete = [t for kind, t in sent_at if kind is p.Complete][-1]
    total = sum(first.values()) + sum(second.values())
    # From the loop's start to just before the last Complete went out: no gap, no overlap.
    assert last_complete - first_claim - 0.005 <= total <= last_complete - started


class SlowPublish(Train):
    def on_publish(self, version: int) -> None:
        time.sleep(0.03)


def test_a_trainers_publishing_is_weights_time_in_its_next_complete(cfg: RunConfig) -> None:
    step_two = p.Lease(2, 102, "train", 5.0, None, train_step().items)
    replies = [p.StepDone(2, 1), p.StepDone(2, 2)]
    link = ScriptedLink({p.Claim: [train_step(), step_two], p.Complete: replies})
    assert make_worker(SlowPublish(), link, cfg).run() == 0
    first, second = (seconds(c) for c in link.of(p.Complete))
    assert first["weights"] == 0 and second["weights"] >= 0.03


class SlowLoad(Generate):
    def on_version(self, version: int) -> int | None:
        if version != self.loaded:
            time.sleep(0.03)
        return super().on_version(version)


def test_a_generators_loading_is_weights_time(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [lease(1, 5, role="generate", version=3)]})
    link.events.put(p.Event(1, "version.published", {"version": 3}))
    assert make_worker(SlowLoad(), link, cfg).run() == 0
    (done,) = link.of(p.Complete)
    assert seconds(done)["weights"] >= 0.03
    assert done.metrics is not None and done.metrics[ACTIVITY_KEY]["tokens"] == 0
