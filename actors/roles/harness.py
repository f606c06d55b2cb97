"""The ``harness`` role: pending → generated, by agent harnesses driving the generators.

With ``data.harness`` set, this role holds the generate stage (runtime/contract/config/pipeline.py)
and the generate workers serve an OpenAI-compatible API instead of claiming leases
(:mod:`..serving`). Consumes ``transition.*.pending`` wake-ups; produces one
:class:`RolloutsOut` per group: each of ``data.group_size`` harness sessions is one
trajectory, its calls merged into sequences exactly as the generators sampled them (loss
mask, per-token log-probs and versions), with the reward its harness returned, which the
reward role keeps. Sessions run on an asyncio loop of this worker's own
(:mod:`..serving.sessions`), so a slow harness holds up neither the worker's talk with the
scheduler nor any generator.

Validation: every ``data.val_every_versions`` versions, and the run's last version as it
ends, the harness worker with index 0 (or none) runs the harness once on each of the
first ``data.val_prompts`` samples of every
validation set, on validation sessions whose calls the generators decode greedily and do
not record, and reports the figures a generator reports of a task, per data source and
overall (a failed session counts 0). Greedy calls make one response per prompt: a
harness run takes ``data.val_samples`` 1 only.
Its calls run on the live generators, so a version loaded meanwhile serves the rest: the
report names the version that was loaded when it began. When the run is over the worker
stays (``lingers``) until the generators run the last version and it has validated that
one (or the newest, if the last does not come within FINAL_VERSION_WAIT_S); the scheduler
keeps the generators and the trainer meanwhile.

A session that raises, outlives ``data.harness_timeout_s``, returns a non-number or
makes no model call fails its group with the reason (tried again, then reported dead),
never the run. A harness that blocks the loop (blocking code in an async function) stops
every session of this worker; once a group outlives the time its sessions can take (one
timeout per wave of ``data.harness_concurrency`` sessions, and one more) the worker gives
its groups back and leaves, to be started afresh.

Versions: the scheduler admits work under the staleness bound by the version its claimant
has loaded; a harness loads no weights, its tokens come from the generators. It reports
the oldest version the live generators run (their API entries, :mod:`..serving.directory`),
never going back, and sends sessions only to generators at least that new: every token of
a group is at least as new as the version it was claimed under.
"""

from __future__ import annotations

import concurrent.futures
import math
import secrets
import threading
import time
from dataclasses import dataclass
from typing import ClassVar

import structlog

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p

from ..actor import FINAL_VERSION_WAIT_S, ActorBroken, Outcome, StreamingActor, WorkerContext
from ..evaluation.scores import Scores
from ..evaluation.sets import ValidationSet, validation_sets
from ..payloads import PromptIn, RolloutsOut
from ..serving.directory import ApiDirectory, ApiEntry
from ..serving.sessions import HarnessFailed, SessionRunner, load_harness
from ..startup.role_checks import check_harness
from ..workload import load_workload

__all__ = ["Harness"]

log = structlog.get_logger("asyncrl.harness")

_LOOK_EVERY_S = 0.05  # how often the generators' entries are read again
_WAIT_S = 0.02  # advance waits this long for a group to finish before giving the loop back
_GRACE_S = 30.0  # beyond the sessions' time: collecting records, a slow start


@dataclass
class _Running:
    lease: p.Lease
    groups: dict[int, concurrent.futures.Future]  # gid → its sessions' result
    overdue_at: float


@dataclass
class _Validation:
    version: int
    started: float
    sets: list[ValidationSet]
    results: concurrent.futures.Future  # per sample, set by set: its reward, or why it failed


class Harness(StreamingActor):
    role: ClassVar[str] = Role.HARNESS.value

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return check_harness(cfg)

    def __init__(self) -> None:
        self.running: dict[int, _Running] = {}
        self.runner: SessionRunner | None = None
        self.loaded: int | None = None  # the oldest version the generators run, as reported
        self.usable: list[ApiEntry] = []  # live generators at least that new
        self._looked_at = -math.inf
        self._finished = threading.Event()
        self.validation: _Validation | None = None
        self.last_validated: int | None = None
        self.reports: list[p.Report] = []
        self.finishing_since: float | None = None  # the run is over: its last validation

    def on_start(self, ctx: WorkerContext) -> None:
        data = ctx.config.data
        self.ctx = ctx
        self.n = data.group_size
        self.name = data.harness
        self.timeout_s = data.harness_timeout_s
        self.directory = ApiDirectory(RunDir.of(ctx.config).api_servers)
        # Claim only what the sessions can start on soon: a group claimed early waits
        # while its staleness budget runs.
        self.groups_at_once = max(1, math.ceil(data.harness_concurrency / self.n))
        # A group's sessions may wait for a free slot: one timeout per wave of them.
        waves = math.ceil(self.n / data.harness_concurrency) + 1
        self.overdue_after_s = waves * self.timeout_s + _GRACE_S
        self.runner = SessionRunner(
            load_harness(data.harness),
            data.harness,
            timeout_s=self.timeout_s,
            concurrency=data.harness_concurrency,
            servers=lambda: self.usable,  # read on the sessions' thread: one list, swapped
        )
        self.validates = ctx.index in (None, 0) and data.val_every_versions > 0
        self.task = load_workload(ctx.config) if self.validates else None

    # --- versions ------------------------------------------------------------------------

    def on_version(self, version: int) -> int | None:
        self._look()
        return self.loaded

    def _look(self) -> None:
        """Read the generators' entries again (at most every _LOOK_EVERY_S)."""
        now = time.monotonic()
        if now - self._looked_at < _LOOK_EVERY_S:
            return
        self._looked_at = now
        live = self.directory.live()
        if live:
            oldest = min(entry.version for entry in live)
            self.loaded = oldest if self.loaded is None else max(self.loaded, oldest)
        floor = self.loaded
        self.usable = [e for e in live if floor is not None and e.version >= floor]
        self._maybe_validate()

    # --- validation ----------------------------------------------------------------------

    def _maybe_validate(self) -> None:
        if not self.validates or self.validation is not None or self.loaded is None:
            return
        every = self.ctx.config.data.val_every_versions
        last = self.last_validated
        if self.finishing_since is not None:
            # The run is over: its last version, once the generators run it (or the
            # newest, if it does not come), unless that one is validated already.
            here = self.loaded >= self.ctx.config.run.total_steps or self._waited_out
            if last == self.loaded or not here:
                return
        elif last is not None and self.loaded // every <= last // every:
            return
        self.last_validated = self.loaded
        sets = validation_sets(self.task, self.ctx.config.data.val_prompts)
        samples = [sample for validation_set in sets for sample in validation_set.samples]
        prefix = f"{self.ctx.worker}-validation-{self.loaded}-{secrets.token_hex(4)}"
        assert self.runner is not None
        results = self.runner.run_validation(samples, prefix)
        results.add_done_callback(lambda _: self._finished.set())
        self.validation = _Validation(self.loaded, time.monotonic(), sets, results)

    def _finish_validation(self) -> None:
        v = self.validation
        if v is None or not v.results.done():
            return
        self.validation = None
        outcomes = iter(v.results.result())
        scores = Scores(v.sets, 1, self.ctx.config.data.val_pass_threshold)
        errors = []
        for which, validation_set in enumerate(v.sets):
            for index in range(len(validation_set.samples)):
                outcome = next(outcomes)
                if isinstance(outcome, str):
                    errors.append(outcome)
                    scores.failed(which, index, None)
                else:  # a session's response lengths are the generators' to know
                    scores.record(which, index, outcome, None)
        if errors:
            log.warning(
                "validation sessions failed", version=v.version, count=len(errors), first=errors[0]
            )
        metrics = scores.metrics()
        metrics["val_seconds"] = round(time.monotonic() - v.started, 3)
        self.reports.append(p.Report(self.ctx.worker, "validation", v.version, metrics))

    def on_run_over(self) -> None:
        self.finishing_since = time.monotonic()

    def lingers(self) -> bool:
        """The run is over and its last version's validation is still to come."""
        if self.finishing_since is None or not self.validates:
            return False
        self._look()  # reads the generators' versions, and may start the last pass
        self._finish_validation()
        if self.validation is not None:
            return True
        validated = self.last_validated is not None and self.last_validated == self.loaded
        done = self.loaded is not None and self.loaded >= self.ctx.config.run.total_steps
        return not (validated and (done or self._waited_out))

    @property
    def _waited_out(self) -> bool:
        """The run's last version has not come in time: the newest one will do."""
        since = self.finishing_since
        return since is not None and time.monotonic() - since >= FINAL_VERSION_WAIT_S

    def take_reports(self) -> list[p.Report]:
        reports, self.reports = self.reports, []
        return reports

    # --- leases --------------------------------------------------------------------------

    def capacity(self) -> int:
        self._look()
        if self.loaded is None or not self.usable:
            return 0
        return 1 if len(self.running) < self.groups_at_once else 0

    @property
    def busy(self) -> bool:
        return bool(self.running) or self.validation is not None

    def admit(self, lease: p.Lease) -> None:
        groups = {}
        for item in lease.items:
            sample = PromptIn.of(item).sample()
            # Unique across workers, retries and restarts: a session's records are its own.
            prefix = f"{self.ctx.worker}-{lease.lease_id}-{item.gid}-{secrets.token_hex(4)}"
            assert self.runner is not None
            future = self.runner.run_group(sample, self.n, prefix)
            future.add_done_callback(lambda _: self._finished.set())
            groups[item.gid] = future
        overdue_at = time.monotonic() + self.overdue_after_s
        self.running[lease.lease_id] = _Running(lease, groups, overdue_at)

    def advance(self) -> list[tuple[p.Lease, Outcome]]:
        self._finished.wait(_WAIT_S)
        self._finished.clear()
        self._look()
        self._finish_validation()
        done, now = [], time.monotonic()
        for lease_id, running in list(self.running.items()):
            if all(future.done() for future in running.groups.values()):
                del self.running[lease_id]
                done.append((running.lease, self._outcome(running)))
            elif now > running.overdue_at:
                raise ActorBroken(
                    f"harness {self.name!r}: a group's sessions still running "
                    f"{self.overdue_after_s:.0f} s after it started, past data.harness_timeout_s;"
                    " blocking code in an async harness stalls its event loop"
                )
        return done

    def _outcome(self, running: _Running) -> Outcome:
        results, failed, tokens = [], [], 0
        for gid, future in running.groups.items():
            try:
                sequences, rewards = future.result()
                rollouts = RolloutsOut.from_sequences(sequences, rewards)
            except HarnessFailed as error:
                failed.append((gid, str(error)))
                continue
            except Exception as error:  # e.g. sessions whose prompts share no first token
                failed.append((gid, f"harness {self.name!r}: {type(error).__name__}: {error}"))
                continue
            tokens += rollouts.trained_tokens()
            results.append(p.Result(gid, rollouts.to_payload(), rollouts.behaviour()))
        return Outcome(tuple(results), tokens=tokens, failed=tuple(failed))

    def abandon(self) -> list[p.Lease]:
        for running in self.running.values():
            for future in running.groups.values():
                future.cancel()
        leases = [running.lease for running in self.running.values()]
        self.running.clear()
        # Measured again at the next due version; at the end of the run the pass goes on,
        # to report the last version.
        if self.validation is not None and self.finishing_since is None:
            self.validation.results.cancel()
            self.validation = None
        return leases

    def on_stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
