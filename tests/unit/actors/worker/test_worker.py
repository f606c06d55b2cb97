"""The worker loop against a scripted scheduler: what it sends for each reply it gets."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from asyncrl.actors.actor import Actor, Outcome, WorkerContext
from asyncrl.actors.worker.loop import Pacing, Worker
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from asyncrl.transport import protocol as p
from asyncrl.transport.link import LinkTimeout
from asyncrl.transport.weights.base import Announcement, WeightsPlan
from tests.support.demo_pipeline import Dataloader, Generate, Logp, Train

Answer = p.Message | Exception


class ScriptedLink:
    """A SchedulerLink whose replies come from ``script`` (per kind) and sane defaults."""

    def __init__(self, script: dict[type, list[Answer]] | None = None) -> None:
        self.script = {kind: list(answers) for kind, answers in (script or {}).items()}
        self.sent: list[p.Message] = []
        self.prefixes: list[str] = []
        self.events: queue.Queue[p.Event] = queue.Queue()
        self.on_request: Callable[[p.Message], None] | None = None
        self._lock = threading.Lock()

    def request(self, message: p.Message, timeout_s: float) -> p.Message:
        p.decode(p.encode(message))  # only what the wire allows
        with self._lock:
            self.sent.append(message)
            answers = self.script.get(type(message))
            answer = answers.pop(0) if answers else _default(message)
        if self.on_request is not None:
            self.on_request(message)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def subscribe(self, prefixes: Sequence[str]) -> None:
        self.prefixes.extend(prefixes)

    def next_event(self, timeout_s: float) -> p.Event | None:
        try:
            return self.events.get(timeout=timeout_s) if timeout_s > 0 else self.events.get_nowait()
        except queue.Empty:
            return None

    def close(self) -> None:
        pass

    def kinds(self, *ignore: type) -> str:
        """The kinds of what was sent, in order, heartbeats (and ``ignore``) left out."""
        skip = (p.Heartbeat, *ignore)
        return " ".join(type(m).__name__ for m in self.sent if not isinstance(m, skip))

    def of(self, kind: type) -> list[p.Message]:
        return [m for m in self.sent if isinstance(m, kind)]


def _default(message: p.Message) -> p.Message:
    match message:
        case p.Hello():
            return p.Ready(message.worker, "test", p.PROTOCOL_VERSION, 0.05, 5.0, 1 << 20, 0)
        case p.Claim():
            return p.Shutdown("the run is finished")
        case p.Status():
            return p.StatusReply({"steps_done": 0, "policy_version": 0})
    return p.Ack()


def lease(lease_id: int, *keys: int, role: str = "logp", version: int | None = None) -> p.Lease:
    tokens = {"tokens": np.arange(3, dtype=np.int32)}
    items = tuple(
        p.Item(i, f"q{i:06d}", {"generate": tokens, "dataloader": {"x": i}}) for i in keys
    )
    return p.Lease(lease_id, lease_id + 100, role, 5.0, version, items)


@pytest.fixture
def cfg(tmp_path: Path) -> RunConfig:
    return config_from_dict({"run": {"dir": str(tmp_path / "run")}})


def make_worker(actor: Actor, link: ScriptedLink, cfg: RunConfig, stop_s: float = 30.0) -> Worker:
    pacing = Pacing(poll_s=0.01, max_backoff_s=0.01, version_check_s=0.05, stop_retry_s=stop_s)
    return Worker(actor, link, cfg, name=f"{actor.role}-0", pacing=pacing)


def test_a_lease_is_processed_completed_and_the_worker_leaves_at_shutdown(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [lease(1, 7), p.NoWork("idle")]})
    assert make_worker(Logp(), link, cfg).run() == 0
    assert link.kinds() == "Hello Claim Complete Claim Claim Bye"
    (done,) = link.of(p.Complete)
    assert (done.lease_id, done.fence) == (1, 101)
    assert done.results == (p.Result(7, {"logp": 1.5}),)


class Boom(Logp):
    def process(self, lease: p.Lease) -> Outcome:
        raise ValueError("bad input")


def test_a_raising_process_fails_the_lease_and_the_worker_goes_on(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [lease(3, 1, 2)]})
    assert make_worker(Boom(), link, cfg).run() == 0
    assert link.kinds() == "Hello Claim Fail Claim Bye"
    assert link.of(p.Fail) == [p.Fail("logp-0", 3, 103, None, "ValueError: bad input")]


def test_a_protocol_mismatch_is_fatal(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Hello: [p.Error("protocol", "worker speaks 1; this speaks 2")]})
    assert make_worker(Logp(), link, cfg).run() == 1
    assert link.kinds() == "Hello"


def test_requests_are_retried_while_the_scheduler_does_not_answer(cfg: RunConfig) -> None:
    timeout = LinkTimeout("no reply")
    link = ScriptedLink({p.Hello: [timeout, timeout], p.Claim: [timeout, lease(1, 4)]})
    link.script[p.Complete] = [timeout]  # the reply to the first Complete is lost
    assert make_worker(Logp(), link, cfg).run() == 0
    assert link.kinds() == "Hello Hello Hello Claim Claim Complete Complete Claim Bye"
    completes = link.of(p.Complete)
    assert len(completes) == 2 and completes[0] == completes[1]  # the same lease and fence


def test_a_complete_for_a_lease_that_ended_is_dropped(cfg: RunConfig) -> None:
    ended = p.Error("stale_fence", "lease 1 has ended")
    link = ScriptedLink({p.Claim: [lease(1, 4)], p.Complete: [ended]})
    assert make_worker(Logp(), link, cfg).run() == 0
    assert link.kinds() == "Hello Claim Complete Claim Bye"


def test_a_refused_complete_gives_the_groups_back(cfg: RunConfig) -> None:
    refused = p.Error("bad_result", "a logp completion takes no behaviour versions")
    link = ScriptedLink({p.Claim: [lease(1, 4)], p.Complete: [refused]})
    assert make_worker(Logp(), link, cfg).run() == 0
    assert link.kinds() == "Hello Claim Complete Fail Claim Bye"


def test_a_forgotten_worker_registers_again_and_retries(cfg: RunConfig) -> None:
    forgotten = p.Error("unknown_worker", "worker 'generate-0' is not registered")
    link = ScriptedLink({p.Claim: [forgotten, lease(1, 2, role="generate", version=0)]})
    assert make_worker(Generate(), link, cfg).run() == 0
    # A new registration holds no weights: the generator reports them again.
    again = "Hello LoadedVersion Claim"
    assert link.kinds(p.Status) == f"{again} {again} Complete Claim Bye"
    (done,) = link.of(p.Complete)
    assert done.results[0].behaviour == (0, 0)


def test_a_generator_loads_each_published_version_and_reports_it(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [p.NoWork("stale"), lease(1, 5, role="generate", version=3)]})
    link.events.put(p.Event(1, "version.published", {"version": 3}))
    generate = Generate()
    assert make_worker(generate, link, cfg).run() == 0
    assert "version.published" in link.prefixes
    assert [m.version for m in link.of(p.LoadedVersion)] == [0, 3]
    assert link.of(p.Complete)[0].results[0].behaviour == (3, 3)


class FetchingGenerate(Generate):
    """A generator whose weights arrive in the background: a version is ready at the
    third look (the first load, of version 0 at start, is instant)."""

    looks = 0

    def on_version(self, version: int) -> int | None:
        self.looks += 1
        if version > 0 and self.looks < 4:
            return self.loaded  # still fetching
        return super().on_version(version)


class TimedLink(ScriptedLink):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.waits: list[float] = []

    def next_event(self, timeout_s: float) -> p.Event | None:
        if timeout_s > 0:
            self.waits.append(timeout_s)
        return super().next_event(timeout_s)


def test_an_idle_generator_looks_for_a_fetched_version_soon_and_claims_with_its_report(
    cfg: RunConfig,
) -> None:
    granted = lease(1, 5, role="generate", version=3)
    link = TimedLink({p.Claim: [p.NoWork("stale")], p.LoadedVersion: [p.Ack(), granted]})
    link.events.put(p.Event(1, "version.published", {"version": 3}))
    pacing = Pacing(poll_s=0.5, fetch_poll_s=0.001, max_backoff_s=0.01, version_check_s=60)
    worker = Worker(FetchingGenerate(), link, cfg, name="generate-0", pacing=pacing)
    assert worker.run() == 0
    loaded_at = link.kinds(p.Hello).split().index("LoadedVersion", 1)
    assert link.kinds(p.Hello).split()[loaded_at : loaded_at + 2] == [
        "LoadedVersion",  # its claim got the lease: no Claim of its own
        "Complete",
    ]
    at_start, loaded = link.of(p.LoadedVersion)
    assert (at_start.claim_next, loaded.claim_next) == (0, 1)  # the loop's room, once it runs
    assert link.waits[0] == 0.001  # behind: it looked again within a millisecond
    assert link.of(p.Complete)[0].results[0].behaviour == (3, 3)


def test_a_report_whose_claim_finds_nothing_waits_to_be_woken(cfg: RunConfig) -> None:
    """The scheduler queued it, as after a NoWork: no Claim of its own until the poll."""
    link = ScriptedLink({p.Claim: [p.NoWork("stale"), lease(1, 5, role="generate", version=3)]})
    sent_at: list[tuple[type, float]] = []
    link.on_request = lambda m: sent_at.append((type(m), time.monotonic()))
    link.events.put(p.Event(1, "version.published", {"version": 3}))
    pacing = Pacing(poll_s=0.3, max_backoff_s=0.01, version_check_s=60)
    assert Worker(Generate(), link, cfg, name="generate-0", pacing=pacing).run() == 0
    assert link.of(p.LoadedVersion)[1] == p.LoadedVersion("generate-0", 3, claim_next=1)
    sent = [(kind, at) for kind, at in sent_at if kind is not p.Heartbeat]
    reported = [kind for kind, _ in sent].index(p.LoadedVersion, 2)  # Hello, LoadedVersion(0)
    (reported_kind, reported_at), (next_kind, next_at) = sent[reported : reported + 2]
    assert (reported_kind, next_kind) == (p.LoadedVersion, p.Claim)
    assert next_at - reported_at >= 0.25


def test_a_generator_asks_for_the_version_when_events_are_lost(cfg: RunConfig) -> None:
    status = p.StatusReply({"steps_done": 2, "policy_version": 2})
    link = ScriptedLink({p.Claim: [p.NoWork("stale")] * 10, p.Status: [status] * 10})
    assert make_worker(Generate(), link, cfg).run() == 0
    assert [m.version for m in link.of(p.LoadedVersion)] == [0, 2]


def test_the_trainer_publishes_the_step_count_after_each_acknowledged_step(
    cfg: RunConfig,
) -> None:
    batch = lease(1, 1, 2, role="train")
    stages = {"logp": {"logp": 1.0}, "ref_logp": {"ref": -2.0}, "reward": {"reward": 1.0}}
    batch_items = tuple(p.Item(i.gid, i.key, {**i.data, **stages}) for i in batch.items)
    step = p.Lease(1, 101, "train", 5.0, None, batch_items)
    link = ScriptedLink({p.Claim: [step], p.Complete: [p.StepDone(2, 1)]})
    assert make_worker(Train(), link, cfg).run() == 0
    # Two round trips a step: the Complete's reply names the version due, so no Status
    # between it and the PublishVersion (the one Status is the start's, to re-announce).
    assert link.kinds() == "Hello Status Claim Complete PublishVersion Claim Bye"
    (done,) = link.of(p.Complete)
    assert done.metrics is not None
    assert done.metrics["groups"] == {"q000001": 3.0, "q000002": 3.0}
    assert link.of(p.PublishVersion) == [p.PublishVersion("train-0", 1)]
    assert done.claim_next == 0  # it publishes the version first, then claims


def test_a_step_acknowledged_without_a_version_publishes_nothing(cfg: RunConfig) -> None:
    """A plain Ack (no step counted: the lease had ended, say) is no reason to publish."""
    link = ScriptedLink({p.Claim: [train_step()], p.Complete: [p.Ack(2)]})
    assert make_worker(Train(), link, cfg).run() == 0
    assert link.of(p.PublishVersion) == []


def train_step() -> p.Lease:
    batch = lease(1, 1, 2, role="train")
    stages = {"logp": {"logp": 1.0}, "ref_logp": {"ref": -2.0}, "reward": {"reward": 1.0}}
    items = tuple(p.Item(i.gid, i.key, {**i.data, **stages}) for i in batch.items)
    return p.Lease(1, 101, "train", 5.0, None, items)


class AnnouncingTrain(Train):
    def __init__(self, announced_version: int | None = None) -> None:
        super().__init__()
        self.announced_version = announced_version

    def on_publish(self, version: int) -> Announcement:
        return Announcement(self.announced_version or version, {"buckets": [[0, 8]]}, b"@t")


def test_the_trainer_sends_its_announcement_with_the_version(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [train_step()], p.Complete: [p.StepDone(2, 1)]})
    assert make_worker(AnnouncingTrain(), link, cfg).run() == 0
    assert link.of(p.PublishVersion) == [
        p.PublishVersion("train-0", 1, {"buckets": [[0, 8]]}, b"@t")
    ]


def test_an_announcement_for_another_version_is_not_published(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [train_step()], p.Complete: [p.StepDone(2, 1)]})
    assert make_worker(AnnouncingTrain(announced_version=7), link, cfg).run() == 0
    assert link.of(p.PublishVersion) == []


class AsksForWeights(Logp):
    """Asks for weights from on_start, as a receiver would, and keeps what it was told."""

    def __init__(self) -> None:
        super().__init__()
        self.plans: list[WeightsPlan | None] = []

    def on_start(self, ctx: WorkerContext) -> None:
        super().on_start(ctx)
        assert ctx.ask_weights is not None
        self.plans.append(ctx.ask_weights(0, b"@me", ""))
        self.plans.append(ctx.ask_weights(4, b"@me", "relay-1"))
        errors: list[BaseException] = []
        other = threading.Thread(target=lambda: _catch(ctx.ask_weights, errors))
        other.start()
        other.join()
        assert isinstance(errors[0], RuntimeError)  # another thread may not use the link


def _catch(ask: Callable[..., object] | None, errors: list[BaseException]) -> None:
    try:
        assert ask is not None
        ask(0, b"", "")
    except BaseException as error:
        errors.append(error)


def test_an_actor_asks_whom_to_fetch_weights_from(cfg: RunConfig) -> None:
    plan = p.WeightsPlan(4, {"buckets": [[0, 8]]}, "train-0", b"@t")
    refused = p.Error("bad_version", "no weights announced for version 4: none is held")
    link = ScriptedLink({p.WantWeights: [plan, refused]})
    actor = AsksForWeights()
    assert make_worker(actor, link, cfg).run() == 0
    assert actor.plans == [plan, None]
    assert link.of(p.WantWeights) == [
        p.WantWeights("logp-0", 0, b"@me", ""),
        p.WantWeights("logp-0", 4, b"@me", "relay-1"),
    ]


def test_stop_finishes_the_current_lease_then_leaves(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [lease(1, 4), lease(2, 5)]})
    worker = make_worker(Logp(), link, cfg)

    class StopsMidLease(Logp):
        def process(self, lease: p.Lease) -> Outcome:
            worker.stop()  # as SIGTERM would, while the lease is being worked on
            return super().process(lease)

    worker.actor = StopsMidLease()
    assert worker.run() == 0
    assert link.kinds() == "Hello Claim Complete Bye"
    assert link.of(p.Complete)[0].claim_next == 0  # leaving: no next lease


def test_a_stopping_worker_gives_up_on_a_scheduler_that_is_gone(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [lease(1, 4)], p.Complete: [LinkTimeout("gone")] * 1000})
    worker = make_worker(Logp(), link, cfg, stop_s=0.05)
    link.on_request = lambda m: worker.stop() if isinstance(m, p.Complete) else None
    assert worker.run() == 0
    assert link.kinds().endswith("Complete Complete Bye")


def test_a_lease_that_came_too_late_is_given_back(cfg: RunConfig) -> None:
    link = ScriptedLink()
    worker = make_worker(Logp(), link, cfg)
    worker.late_reply(lease(9, 1))
    worker.late_reply(p.Ack())
    assert link.sent == [p.Fail("logp-0", 9, 109, None, "lease arrived too late")]


def test_the_dataloader_feeds_what_the_scheduler_wants(cfg: RunConfig) -> None:
    skipped = p.Added(("q000002",), ("q000000", "q000001"))
    link = ScriptedLink({p.Claim: [p.Want(3), p.Want(0), p.Want(2)], p.AddGroups: [skipped]})
    assert make_worker(Dataloader(), link, cfg).run() == 0
    assert link.kinds() == "Hello Claim AddGroups Claim Claim AddGroups Claim Bye"
    first, second = link.of(p.AddGroups)
    assert [g.key for g in first.groups] == ["q000000", "q000001", "q000002"]
    assert [g.key for g in second.groups] == ["q000003", "q000004"]
    assert second.groups[0].data == {"x": 3}


def test_a_worker_stopped_before_the_scheduler_answers_leaves_at_once(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Hello: [LinkTimeout("nobody there")] * 1000})
    worker = make_worker(Logp(), link, cfg)
    link.on_request = lambda _m: worker.stop()
    assert worker.run() == 0
    assert link.kinds() == "Hello"  # not registered: no goodbye owed


def test_heartbeats_go_on_while_a_long_lease_is_worked_on(cfg: RunConfig) -> None:
    link = ScriptedLink({p.Claim: [lease(1, 4)]})
    assert make_worker(Logp(work_s=0.3), link, cfg).run() == 0  # beats every 0.05 s
    assert len(link.of(p.Heartbeat)) >= 2
    assert link.kinds() == "Hello Claim Complete Claim Bye"


def test_a_complete_asks_for_the_next_lease_and_the_one_it_gets_is_held_as_claimed(
    cfg: RunConfig,
) -> None:
    link = ScriptedLink({p.Claim: [lease(1, 4)], p.Complete: [lease(2, 5)]})
    assert make_worker(Logp(work_s=0.3), link, cfg).run() == 0  # beats every 0.05 s
    # One round trip per lease: the second came as the reply to the first's Complete.
    assert link.kinds() == "Hello Claim Complete Complete Claim Bye"
    first, second = link.of(p.Complete)
    assert (first.lease_id, second.lease_id) == (1, 2) and second.fence == 102
    assert first.claim_next == second.claim_next == Logp.claim_size
    assert second.results == (p.Result(5, {"logp": 1.5}),)
    # Renewed while worked on, as a claimed lease is: heartbeats name it, and only it.
    beats = [m.leases for m in link.of(p.Heartbeat)]
    assert (2,) in beats and (1, 2) not in beats


def test_a_complete_that_got_no_lease_waits_for_its_wake_up_before_claiming(
    cfg: RunConfig,
) -> None:
    link = ScriptedLink({p.Claim: [lease(1, 4)]})  # the Complete's reply: Ack, no lease
    pacing = Pacing(poll_s=30.0, max_backoff_s=0.01, version_check_s=0.05)
    worker = Worker(Logp(), link, cfg, name="logp-0", pacing=pacing)
    sent: list[tuple[str, float]] = []
    woken_at: list[float] = []

    def wake_soon() -> None:
        time.sleep(0.3)
        woken_at.append(time.monotonic())
        link.events.put(p.Event(1, "wake.logp-0/", {}))

    def note(message: p.Message) -> None:
        sent.append((type(message).__name__, time.monotonic()))
        if isinstance(message, p.Complete):
            threading.Thread(target=wake_soon, daemon=True).start()
        elif isinstance(message, p.Claim) and woken_at:  # answered Shutdown: the run ends
            link.events.put(p.Event(2, "run.finished", {}))

    link.on_request = note
    began = time.monotonic()
    assert worker.run() == 0
    assert time.monotonic() - began < 10  # woken, not the 30 s poll
    claims = [at for kind, at in sent if kind == "Claim"]
    assert len(claims) == 2 and claims[1] >= woken_at[0]  # not before the wake-up


def test_a_trainer_registered_again_announces_its_version_again(cfg: RunConfig) -> None:
    # The scheduler declared the trainer lost (and dropped its announcement) while it was
    # alive: after registering again it must announce its current version's weights, or
    # generators can never load them and the trainer never gets another step.
    forgotten = p.Error("unknown_worker", "worker 'train-0' is not registered")
    announced = p.StatusReply({"steps_done": 3, "policy_version": 3, "weights": {"version": 3}})
    dropped = p.StatusReply({"steps_done": 3, "policy_version": 3, "weights": None})
    claims: list[Answer] = [forgotten, p.NoWork("idle")]
    link = ScriptedLink({p.Claim: claims, p.Status: [announced, dropped]})
    assert make_worker(AnnouncingTrain(), link, cfg).run() == 0
    assert link.kinds() == "Hello Status Claim Hello Claim Status PublishVersion Claim Bye"
    assert link.of(p.PublishVersion) == [
        p.PublishVersion("train-0", 3, {"buckets": [[0, 8]]}, b"@t")
    ]


def test_a_trainer_announces_again_when_a_receiver_found_no_weights(cfg: RunConfig) -> None:
    # A restarted scheduler knows the trainer (it is journaled) but not its announcement:
    # a generator started since finds no weights, and the scheduler says so on the bus.
    announced = p.StatusReply({"steps_done": 3, "policy_version": 3, "weights": {"version": 3}})
    forgot = p.StatusReply({"steps_done": 3, "policy_version": 3, "weights": None})
    link = ScriptedLink({p.Claim: [p.NoWork("idle")], p.Status: [announced, forgot]})
    wanted = p.Event(1, "version.wanted", {"version": 3})
    told: list[p.Event] = []

    def on_request(message: p.Message) -> None:  # after the first claim, once
        if isinstance(message, p.Claim) and not told:
            told.append(wanted)
            link.events.put(wanted)

    link.on_request = on_request
    pacing = Pacing(poll_s=0.01, max_backoff_s=0.01, version_check_s=60.0)  # no polling
    assert Worker(AnnouncingTrain(), link, cfg, name="train-0", pacing=pacing).run() == 0
    assert "version.wanted" in link.prefixes
    assert link.kinds() == "Hello Status Claim Status PublishVersion Claim Bye"


class AnnouncingCritic(Actor):
    """PPO's critic as the loop sees it: it publishes the critic's versions, with weights."""

    role = "critic"
    publishes_versions = True
    follows_critic = True

    def process(self, lease: p.Lease) -> Outcome:
        raise AssertionError("no critic step in these tests")

    def on_publish(self, version: int) -> Announcement:
        return Announcement(version, {"buckets": [[0, 4]]}, b"@c")


def test_a_critic_announces_again_when_a_values_worker_found_no_weights(tmp_path: Path) -> None:
    # After a scheduler restart a values worker finds no critic weights, and the scheduler
    # says so on the critic's own topic: the policy's "wanted" is not the critic's business.
    ppo = config_from_dict({"run": {"dir": str(tmp_path)}, "algorithm": {"estimator": "gae"}})
    held = {"steps_done": 3, "version": 3, "weights": {"version": 3}}
    forgot = {"steps_done": 3, "version": 3, "weights": {"version": None}}
    status = [
        p.StatusReply({"steps_done": 5, "policy_version": 5, "critic": c}) for c in (held, forgot)
    ]
    link = ScriptedLink({p.Claim: [p.NoWork("idle")], p.Status: status})
    wanted = p.Event(1, "version.critic_wanted", {"version": 3})

    def on_request(message: p.Message) -> None:  # after the first claim, once
        if isinstance(message, p.Claim) and link.events.empty() and len(link.of(p.Claim)) == 1:
            link.events.put(wanted)

    link.on_request = on_request
    pacing = Pacing(poll_s=0.01, max_backoff_s=0.01, version_check_s=60.0)  # no polling
    assert Worker(AnnouncingCritic(), link, ppo, name="critic-0", pacing=pacing).run() == 0
    assert "version.critic_wanted" in link.prefixes and "version.wanted" not in link.prefixes
    assert link.kinds() == "Hello Status Claim Status PublishVersion Claim Bye"
    assert link.of(p.PublishVersion) == [
        p.PublishVersion("critic-0", 3, {"buckets": [[0, 4]]}, b"@c")
    ]


def test_an_idle_trainer_checks_now_and_then_that_its_weights_are_held(cfg: RunConfig) -> None:
    # The event may drop: an idle trainer asks the status itself.
    announced = p.StatusReply({"steps_done": 3, "policy_version": 3, "weights": {"version": 3}})
    forgot = p.StatusReply({"steps_done": 3, "policy_version": 3, "weights": None})
    idle: list[Answer] = [p.NoWork("idle")] * 20
    link = ScriptedLink({p.Claim: idle, p.Status: [announced, forgot]})
    link.script[p.Status] += [announced] * 100
    assert make_worker(AnnouncingTrain(), link, cfg).run() == 0
    assert link.of(p.PublishVersion) == [
        p.PublishVersion("train-0", 3, {"buckets": [[0, 8]]}, b"@t")
    ]


class SlowStart(Logp):
    def on_start(self, ctx: WorkerContext) -> None:
        super().on_start(ctx)
        time.sleep(0.3)  # a trainer loading its checkpoint


def test_heartbeats_start_at_registration_not_after_a_slow_start(cfg: RunConfig) -> None:
    link = ScriptedLink()
    assert make_worker(SlowStart(), link, cfg).run() == 0  # beats every 0.05 s
    first_claim = next(i for i, m in enumerate(link.sent) if isinstance(m, p.Claim))
    assert sum(isinstance(m, p.Heartbeat) for m in link.sent[:first_claim]) >= 2
