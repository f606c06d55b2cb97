"""The ``generate`` role: pending → generated, by continuous batching on the policy model.

Consumes ``transition.*.pending`` wake-ups; produces one :class:`RolloutsOut` per group
(``data.group_size`` sampled responses with per-token log-probs and versions). Leases
stream through one decoder: a group's sequences join the running batch as soon as there
are free slots, and a lease is completed the moment its last sequence ends, so a long
response never keeps the others waiting.

New versions load between two decode steps (the worker calls ``on_version`` there);
sequences in flight continue under the new weights and their tokens say so.

Validation runs beside training, on the same decode loop: every ``data.val_every_versions``
versions, the generator with index 0 (or no index) decodes the validation prompts
greedily with a frozen copy of that version and reports their mean reward. With
``data.val_every_versions: 0`` it never validates (a benchmark that scores checkpoints
afterwards keeps the generator's time for training).

With ``data.harness`` set, agent harnesses hold the generate stage: the generator claims
no leases and serves their model calls instead, over an OpenAI-compatible API on a thread
of its own (:mod:`.serving`), decoded in the same batch and following versions the same.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import structlog

from asyncrl.runtime.config import RunConfig
from asyncrl.runtime.core.pipeline import Role
from asyncrl.runtime.rundir import RunDir
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import make_receiver

from ._setup import load_policy
from ._weights import WeightFollower
from .actor import Outcome, StreamingActor, WorkerContext
from .payloads import PromptIn, RolloutsOut
from .policy.decoder import Decoder, Finished, Request
from .preflight import check_device, check_engine, check_model, check_task
from .serving.serving import Serving
from .tasks import Sample, TaskError, validation_samples
from .workload import load_workload, reward_for

__all__ = ["Generate"]

log = structlog.get_logger("asyncrl.generate")

DEFAULT_SLOTS = 64  # sequences decoded at once
# An idle generator serving harnesses looks for requests this often (the worker's own idle
# poll waits for the scheduler's events, which say nothing of HTTP requests).
SERVE_POLL_S = 0.005


@dataclass
class _Running:
    lease: p.Lease
    waiting: int  # sequences not yet finished
    rows: dict[int, dict[int, Finished]] = field(default_factory=dict)  # gid → seq → result


@dataclass
class _Validation:
    version: int
    decoder: Decoder
    samples: list[Sample]
    started: float
    rewards: list[float] = field(default_factory=list)
    errors: int = 0  # responses the reward function failed on (counted as 0)


class Generate(StreamingActor):
    role: ClassVar[str] = Role.GENERATE.value

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return [
            *check_engine(cfg, cls.role),
            *check_device(cfg),
            *check_model(cfg),
            *check_task(cfg),
        ]

    def __init__(self, slots: int = DEFAULT_SLOTS) -> None:
        self.slots = slots
        self.running: dict[int, _Running] = {}
        self.validation: _Validation | None = None
        self.reports: list[p.Report] = []
        self.loaded = 0
        self.last_validated: int | None = None
        self.serving: Serving | None = None

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = ctx.config
        self.ctx = ctx
        self.model, self.codec = load_policy(cfg, self.role, ctx.index)
        self.task = load_workload(cfg)
        self.reward = reward_for(cfg, self.task)
        self.weights = WeightFollower(
            make_receiver(cfg.weights, RunDir.of(cfg).weight_dirs(cfg.weights)), ctx.ask_weights
        )
        self.n = cfg.data.group_size
        if self.n > self.slots:
            raise ValueError(f"data.group_size={self.n} exceeds the decoder's {self.slots} slots")
        self.validates = ctx.index in (None, 0)
        self.decoder = self._decoder(self.model, greedy_only=False)
        if cfg.data.harness:
            self.serving = Serving(
                cfg,
                ctx.worker,
                self.codec,
                vocab_size=self.model.config.vocab_size,
                max_prompt_tokens=self.decoder.max_prompt_tokens,
                version=self.loaded,
            )

    def _decoder(self, model, *, greedy_only: bool) -> Decoder:
        cfg = self.ctx.config
        max_new = cfg.model.max_new_tokens
        return Decoder(
            model,
            slots=self.slots,
            max_new_tokens=max_new,
            # Not the model's whole context: a real model's would make a cache of many GiB.
            max_prompt_tokens=min(
                cfg.model.max_prompt_tokens, model.config.max_position_embeddings - max_new
            ),
            eos_id=self.codec.eos_ids,
            pad_id=self.codec.pad_id,
            temperature=1.0 if greedy_only else cfg.algorithm.temperature,
            seed=cfg.run.seed + (self.ctx.index or 0),
            version=self.loaded,
        )

    # --- versions ------------------------------------------------------------------------

    def on_version(self, version: int) -> int | None:
        received = self.weights.step(version, self.loaded)
        if received is not None:
            started = time.perf_counter()
            # The model runs on the receiver's checked buffer itself (no copy); in-flight
            # sequences carry on, their caches recomputed at the next step.
            superseded = self.decoder.load(received.state, received.version, copy=False)
            cost = self.weights.loaded(received, time.perf_counter() - started, superseded)
            self.loaded = received.version
            self.reports.append(p.Report(self.ctx.worker, "weights", self.loaded, cost))
            if self.serving is not None:
                self.serving.loaded(self.loaded)
        self._maybe_validate()
        return self.loaded

    def _maybe_validate(self) -> None:
        every = self.ctx.config.data.val_every_versions
        if every == 0:
            return
        due = self.last_validated is None or self.loaded // every > self.last_validated // every
        if not (self.validates and due and self.validation is None):
            return
        self.last_validated = self.loaded
        frozen = copy.deepcopy(self.model)  # the decoder's model changes under training
        decoder = self._decoder(frozen, greedy_only=True)
        samples = validation_samples(self.task, self.ctx.config.data.val_prompts)
        decoder.submit(
            Request(i, tuple(self.codec.encode(s.prompt)), greedy=True)
            for i, s in enumerate(samples)
        )
        self.validation = _Validation(self.loaded, decoder, samples, time.monotonic())

    # --- leases --------------------------------------------------------------------------

    def capacity(self) -> int:
        if self.serving is not None:
            return 0  # the harnesses hold the generate stage
        return max(0, self.decoder.free_slots // self.n)

    @property
    def busy(self) -> bool:
        serving = self.serving is not None and self.serving.busy
        return bool(self.running) or self.validation is not None or serving

    def wake_within_s(self) -> float | None:
        return None if self.serving is None else SERVE_POLL_S

    def admit(self, lease: p.Lease) -> None:
        for item in lease.items:
            prompt = tuple(self.codec.encode(PromptIn.of(item).prompt))
            self.decoder.submit(
                Request((lease.lease_id, item.gid, j), prompt) for j in range(self.n)
            )
        self.running[lease.lease_id] = _Running(lease, waiting=len(lease.items) * self.n)

    def advance(self) -> list[tuple[p.Lease, Outcome]]:
        done = []
        if self.serving is not None:
            self.decoder.submit(self.serving.take())
        for finished in self.decoder.step():
            if self.serving is not None and self.serving.owns(finished):
                self.serving.finish(finished)
                continue
            lease_id, gid, j = finished.tag
            running = self.running[lease_id]
            running.rows.setdefault(gid, {})[j] = finished
            running.waiting -= 1
            if running.waiting == 0:
                del self.running[lease_id]
                tokens = sum(len(f.tokens) for rows in running.rows.values() for f in rows.values())
                done.append((running.lease, Outcome(self._results(running), tokens=tokens)))
        self._advance_validation()
        return done

    def abandon(self) -> list[p.Lease]:
        leases = [running.lease for running in self.running.values()]
        self.running.clear()
        self.validation = None  # measured again at the next due version
        self.decoder = self._decoder(self.model, greedy_only=False)
        if self.serving is not None:
            self.serving.dropped("its decode step failed")
        return leases

    def _results(self, running: _Running) -> tuple[p.Result, ...]:
        results = []
        for item in running.lease.items:
            rows = running.rows[item.gid]
            prompt = list(rows[0].prompt)
            rollouts = RolloutsOut.stack(
                prompt,
                [(f.tokens, f.logprobs, f.versions, f.truncated) for _, f in sorted(rows.items())],
            )
            results.append(p.Result(item.gid, rollouts.to_payload(), rollouts.behaviour()))
        return tuple(results)

    # --- validation ----------------------------------------------------------------------

    def _advance_validation(self) -> None:
        v = self.validation
        if v is None:
            return
        for finished in v.decoder.step():
            response = self.codec.decode(finished.tokens)
            try:
                reward = self.reward(v.samples[finished.tag], response)
            except TaskError as error:
                log.warning("validation reward failed", version=v.version, reason=str(error))
                reward, v.errors = 0.0, v.errors + 1
            v.rewards.append(reward)
        if v.decoder.busy:
            return
        rewards = np.asarray(v.rewards, np.float64)
        metrics = {
            "val_reward": float(rewards.mean()),
            "val_prompts": len(rewards),
            "val_reward_errors": v.errors,
            "val_seconds": round(time.monotonic() - v.started, 3),
        }
        self.reports.append(p.Report(self.ctx.worker, "validation", v.version, metrics))
        self.validation = None

    def on_stop(self) -> None:
        if self.serving is not None:
            self.serving.stop()
        self.weights.receiver.close()

    def take_reports(self) -> list[p.Report]:
        reports, self.reports = self.reports, []
        return reports
