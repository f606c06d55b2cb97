"""The demo pipeline end to end on the in-process scheduler: every role a worker thread.

The demo's work is exact arithmetic, so each test checks every trained value, not a
summary: steps 1..N once each, every key once, every value equal to the formula.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from asyncrl.actors.actor import Actor, Outcome
from asyncrl.actors.worker.loop import Pacing, Worker
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from asyncrl.transport import protocol as p
from tests.support.demo_pipeline import (
    Dataloader,
    Generate,
    Logp,
    RefLogp,
    Reward,
    Train,
    expected_value,
    prompt_key,
)
from tests.support.inprocess_hub import InProcessHub

STEPS = 20
BATCH = 4
RUN_TIMEOUT_S = 20.0


def make_config(tmp_path: Path, **pipeline: Any) -> RunConfig:
    return config_from_dict(
        {
            "run": {"dir": str(tmp_path / "run"), "total_steps": STEPS},
            "pipeline": {"train_batch_groups": BATCH, "lease_timeout_s": 10.0, **pipeline},
            "algorithm": {"kl_coef": 0.01},  # the demo runs every stage, ref_logp included
            "scheduler": {"heartbeat_interval_s": 0.2},
        }
    )


def demo_actors(*extra: Actor, replace: Iterable[str] = ()) -> list[Actor]:
    """One demo actor per role, minus the roles in ``replace``, plus ``extra``."""
    standard = [Dataloader(), Generate(), Logp(), RefLogp(), Reward(), Train()]
    return [a for a in standard if a.role not in set(replace)] + list(extra)


def run_pipeline(
    cfg: RunConfig,
    actors: list[Actor],
    prepare: Callable[[InProcessHub], None] | None = None,
    timeout_s: float = RUN_TIMEOUT_S,
    prepare_workers: Callable[[list[Worker]], None] | None = None,
) -> dict[str, Any]:
    """Run ``actors`` as worker threads on one hub to the end; the scheduler's last status."""
    hub = InProcessHub(cfg)
    try:
        if prepare is not None:
            prepare(hub)
        workers = _name_workers(hub, cfg, actors)
        if prepare_workers is not None:
            prepare_workers(workers)
        codes = _run_threads(workers, timeout_s)
        assert codes == {w.name: 0 for w in workers}
        return hub.service.status(hub.clock())
    finally:
        hub.close()


def _name_workers(hub: InProcessHub, cfg: RunConfig, actors: list[Actor]) -> list[Worker]:
    seen: Counter[str] = Counter()
    workers = []
    for actor in actors:
        name = f"{actor.role}-{seen[actor.role]}"
        seen[actor.role] += 1
        workers.append(Worker(actor, hub.link(), cfg, name=name, pacing=Pacing(poll_s=0.1)))
    return workers


def _run_threads(workers: list[Worker], timeout_s: float) -> dict[str, int]:
    codes: dict[str, int] = {}

    def run(worker: Worker) -> None:
        codes[worker.name] = worker.run()

    threads = [threading.Thread(target=run, args=(w,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [w.name for w, t in zip(workers, threads, strict=True) if t.is_alive()]
    if stuck:
        for worker in workers:
            worker.stop()
            worker.stop()
        pytest.fail(f"the run did not finish in {timeout_s:g}s; still running: {stuck}")
    return codes


def read_steps(cfg: RunConfig) -> list[dict[str, Any]]:
    text = (Path(cfg.run.dir) / "metrics.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def check_every_value(cfg: RunConfig) -> list[dict[str, Any]]:
    """Steps 1..STEPS once each; every key trained once with its exact value."""
    steps = read_steps(cfg)
    assert [line["step"] for line in steps] == list(range(1, STEPS + 1))
    trained = Counter(key for line in steps for key in line["groups"])
    assert trained == Counter(prompt_key(i) for i in range(STEPS * BATCH))
    for line in steps:
        assert line["batch_groups"] == BATCH
        for key, value in line["groups"].items():
            assert value == expected_value(int(key[1:])), key
    return steps


def check_staleness(status: dict[str, Any], bound: int) -> None:
    assert status["run"]["finished"]
    assert status["dead"] == {}
    worst = status["staleness"]["worst_trained"]
    assert worst is not None and worst <= bound


def test_the_demo_pipeline_trains_every_group_exactly(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    status = run_pipeline(cfg, demo_actors())
    check_every_value(cfg)
    check_staleness(status, cfg.pipeline.max_staleness)
    assert status["policy_version"] == STEPS  # the trainer published after every step


class RecordingLink:
    """A worker's link that keeps every request it carries."""

    def __init__(self, link: Any) -> None:
        self.link = link
        self.sent: list[p.Message] = []

    def request(self, message: p.Message, timeout_s: float) -> p.Message:
        self.sent.append(message)
        return self.link.request(message, timeout_s)

    def __getattr__(self, name: str) -> Any:  # events and subscriptions: the link's own
        return getattr(self.link, name)


def test_a_train_step_costs_the_trainer_two_requests(tmp_path: Path) -> None:
    """Complete, whose reply names the version due, then PublishVersion: no Status between
    (there was one: three requests a step). Status once, at start, to announce again what
    a restart may have lost."""
    cfg = make_config(tmp_path)
    recorders: list[RecordingLink] = []

    def record_trainer(workers: list[Worker]) -> None:
        (trainer,) = [w for w in workers if w.role == "train"]
        trainer.link = RecordingLink(trainer.link)  # type: ignore[assignment]
        recorders.append(trainer.link)  # type: ignore[arg-type]

    run_pipeline(cfg, demo_actors(), prepare_workers=record_trainer)
    (recorder,) = recorders
    skip = p.Heartbeat | p.Claim | p.Held
    kinds = [type(m).__name__ for m in recorder.sent if not isinstance(m, skip)]
    assert kinds == ["Hello", "Status", *["Complete", "PublishVersion"] * STEPS, "Bye"]
    published = [m.version for m in recorder.sent if isinstance(m, p.PublishVersion)]
    assert published == list(range(1, STEPS + 1))


class FailsOnce(Logp):
    """logp that raises the first time it is given ``key``."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.failures = 0

    def process(self, lease: p.Lease) -> Outcome:
        if not self.failures and any(item.key == self.key for item in lease.items):
            self.failures += 1
            raise RuntimeError(f"planted failure on {self.key}")
        return super().process(lease)


def test_a_failed_lease_is_retried_and_the_run_completes(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    flaky = FailsOnce(prompt_key(9))
    run_pipeline(cfg, demo_actors(flaky, replace=["logp"]))
    assert flaky.failures == 1
    check_every_value(cfg)


def test_two_generators_and_two_logp_workers_share_the_work(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    status = run_pipeline(cfg, demo_actors(Generate(), Logp()))
    check_every_value(cfg)
    check_staleness(status, cfg.pipeline.max_staleness)


def test_a_synchronous_run_completes_on_policy(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, max_staleness=0)
    status = run_pipeline(cfg, demo_actors(Generate()))
    steps = check_every_value(cfg)
    check_staleness(status, 0)
    # On policy: step s trains on what version s - 1 generated, and that is what was out.
    assert [line["policy_version"] for line in steps] == list(range(STEPS))


def add_early_groups(hub: InProcessHub, count: int) -> None:
    """What a dataloader that has since died added: the first ``count`` demo groups."""
    link = hub.link()
    assert isinstance(
        link.request(p.Hello("loader-old", "dataloader", p.PROTOCOL_VERSION, 0), 1), p.Ready
    )
    early = tuple(p.NewGroup(prompt_key(i), {"x": i}) for i in range(count))
    added = link.request(p.AddGroups("loader-old", early), 1)
    assert added == p.Added(tuple(g.key for g in early), ())
    assert isinstance(link.request(p.Bye("loader-old", "died"), 1), p.Ack)
    link.close()


def test_a_dataloader_that_starts_over_skips_what_the_scheduler_has(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    status = run_pipeline(cfg, demo_actors(), prepare=lambda hub: add_early_groups(hub, 6))
    check_every_value(cfg)  # q000000..q000005 once each, though the new loader offered them
    check_staleness(status, cfg.pipeline.max_staleness)
