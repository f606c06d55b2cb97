"""The ``generate`` role: pending → generated, by continuous batching on the policy model.

Consumes ``transition.*.pending`` wake-ups; produces one :class:`RolloutsOut` per group
(``data.group_size`` sampled trajectories with per-token log-probs and versions). Leases
stream through one decoder: a group's sequences join the running batch as soon as there
are free slots, and a lease is completed the moment its last trajectory ends, so a long
response never keeps the others waiting. With ``data.environment`` a trajectory is an
episode of turns (:mod:`..episodes`): the environment's observations go between the
model's turns, untrained, and its step rewards are the trajectory's reward. An episode
whose environment fails fails its group, with the reason; the lease's other groups
complete.

New versions load between two decode steps (the worker calls ``on_version`` there);
sequences in flight continue under the new weights and their tokens say so.

With ``backends.generate: vllm`` or ``sglang`` another engine does the decoding instead of
our own decoder (:mod:`..engines.vllm`, :mod:`..engines.sglang`): the same episodes,
validation and served API drive it, new versions go into it between two of its steps, and
it holds the only copy of the weights. vLLM runs inside this process (it ends with it);
SGLang in processes of its own, new versions sent in flattened buckets.

Validation runs beside training, on the same decode loop: every ``data.val_every_versions``
versions, the generator with index 0 (or no index) decodes the validation prompts
greedily with a frozen copy of that version and reports their mean reward. With
``data.val_every_versions: 0`` it never validates (a benchmark that scores checkpoints
afterwards keeps the generator's time for training).

With ``data.harness`` set, agent harnesses hold the generate stage: the generator takes
no lease and serves their model calls instead, over an OpenAI-compatible API on a thread
of its own (:mod:`..serving`), decoded by this loop and following versions the same.
With a generative judge (``data.reward: judge:...``) it serves the same API beside its
leases: the judge's calls join the batch, decoded greedily and never recorded, and
validation scores with the task's own reward instead of the judge.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import structlog

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import make_receiver

from ..actor import ActorBroken, Outcome, StreamingActor, WorkerContext
from ..engines.sglang.engine import SGLangDecoder
from ..engines.vllm.decoder import VLLMDecoder
from ..engines.vllm.engine import VLLMEngine
from ..episodes import EpisodeDone, EpisodeLimits, Episodes
from ..payloads import PromptIn, RolloutsOut, Sampled
from ..policy.decoder import Decoder, Decoding, Finished
from ..policy.model import CausalLM
from ..serving.serving import Serving
from ..startup.model_loading import load_policy, start_sglang, start_vllm
from ..startup.role_checks import check_device, check_engine, check_model, check_task
from ..startup.router_replay import router_replay_problems
from ..tasks import Sample, TaskError, validation_samples
from ..tasks.environment import load_environment, stop_ids
from ..worker.weight_following import StallBounds, WeightFollower, weights_access
from ..workload import load_workload, serves_api, validation_reward_for

__all__ = ["Generate"]

log = structlog.get_logger("asyncrl.generate")

DEFAULT_SLOTS = 64  # sequences decoded at once
# An idle generator serving harnesses looks for requests this often (the worker's own idle
# poll waits for the scheduler's events, which say nothing of HTTP requests).
SERVE_POLL_S = 0.005
_MAX_STUCK = 3  # environment calls left running past their time before a fresh process


@dataclass
class _Running:
    lease: p.Lease
    waiting: int  # trajectories not yet finished
    rows: dict[int, dict[int, EpisodeDone]] = field(default_factory=dict)  # gid → j → done
    failed: dict[int, str] = field(default_factory=dict)  # gid → why


@dataclass
class _Validation:
    version: int
    episodes: Episodes
    samples: list[Sample]
    started: float
    rewards: list[float] = field(default_factory=list)
    errors: int = 0  # responses the reward function or environment failed on (counted as 0)


class Generate(StreamingActor):
    role: ClassVar[str] = Role.GENERATE.value

    @classmethod
    def check(cls, cfg: RunConfig) -> list[str]:
        return [
            *check_engine(cfg, cls.role),
            *check_device(cfg),
            *check_model(cfg),
            *check_task(cfg),
            *router_replay_problems(cfg, cls.role),
        ]

    def __init__(self, slots: int = DEFAULT_SLOTS) -> None:
        self.slots = slots
        self.running: dict[int, _Running] = {}
        self.validation: _Validation | None = None
        self.reports: list[p.Report] = []
        self.loaded = 0
        self.last_validated: int | None = None
        self.serving: Serving | None = None
        self.serves_only = False

    def on_start(self, ctx: WorkerContext) -> None:
        cfg = ctx.config
        self.ctx = ctx
        # vLLM and SGLang load model.path themselves and hold the weights; this process
        # keeps no model of its own then.
        self.engine = None
        if cfg.backends.generate == "vllm":
            self.model = None
            self.engine, self.codec, self.model_config = start_vllm(cfg, ctx.index)
        elif cfg.backends.generate == "sglang":
            self.model = None
            self.engine, self.codec, self.model_config = start_sglang(cfg, ctx.index)
        else:
            self.model, self.codec = load_policy(cfg, self.role, ctx.index)
            self.model_config = self.model.config
        self.task = load_workload(cfg)
        self.reward = validation_reward_for(cfg, self.task)
        self.weights = WeightFollower(
            make_receiver(
                cfg.weights, RunDir.of(cfg).weight_dirs(cfg.weights), weights_access(ctx)
            ),
            ctx.ask_weights,
            StallBounds.of(ctx.worker, cfg.weights),
        )
        self.n = cfg.data.group_size
        if self.n > self.slots:
            raise ValueError(f"data.group_size={self.n} exceeds the decoder's {self.slots} slots")
        # With harnesses, the harness role validates: through the API, as the agent runs.
        self.validates = ctx.index in (None, 0) and not cfg.data.harness
        data = cfg.data
        self.environment = load_environment(data.environment) if data.environment else None
        self.stop_ids = (
            stop_ids(self.environment(), self.codec.encode) if self.environment else frozenset()
        )
        self.episodes = self._episodes(self.model, greedy_only=False)
        # Harnesses hold the generate stage: this generator then takes no lease and serves
        # their calls only. A judge's calls join the batch of the leases.
        self.serves_only = bool(data.harness)
        if serves_api(cfg):
            self.serving = Serving(
                cfg,
                ctx.worker,
                self.codec,
                vocab_size=self.model_config.vocab_size,
                max_prompt_tokens=self.decoder.max_prompt_tokens,
                version=self.loaded,
            )

    def _episodes(self, model, *, greedy_only: bool) -> Episodes:
        cfg = self.ctx.config
        decoder = self._decoder(model, greedy_only=greedy_only)
        data = cfg.data
        context = decoder.max_prompt_tokens + decoder.max_new_tokens
        limits = EpisodeLimits(
            max_turns=data.max_turns if self.environment else 1,
            max_total_tokens=min(data.max_total_tokens or context, context),
            step_timeout_s=data.env_step_timeout_s,
        )
        return Episodes(
            decoder,
            self.codec,
            environment=self.environment,
            name=data.environment,
            limits=limits,
            stop_ids=self.stop_ids,
            others=self._answer_served,
        )

    def _decoder(self, model: CausalLM | None, *, greedy_only: bool) -> Decoding:
        """A decoder over ``model``, or over the engine (which has no model here)."""
        cfg = self.ctx.config
        max_new = cfg.model.max_new_tokens
        # Not the model's whole context: a real model's would make a cache of many GiB.
        max_prompt = min(
            cfg.model.max_prompt_tokens, self.model_config.max_position_embeddings - max_new
        )
        # A greedy-only decoder's sequences take the most likely token whatever these are.
        a = cfg.algorithm
        defaults: dict[str, Any] = (
            {}
            if greedy_only
            else dict(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, min_p=a.min_p)
        )
        # Stop texts say where a response ends, not how it samples: every decoder has them,
        # found on the codec's text whichever engine samples.
        defaults |= dict(stop=tuple(a.stop), decode=self.codec.decode)
        if isinstance(self.engine, VLLMEngine):
            return VLLMDecoder(
                self.engine,
                slots=self.slots,
                max_new_tokens=max_new,
                max_prompt_tokens=max_prompt,
                eos_id=self.codec.eos_ids,
                seed=cfg.run.seed + (self.ctx.index or 0),
                **defaults,
            )
        if self.engine is not None:
            return SGLangDecoder(
                self.engine,
                slots=self.slots,
                max_new_tokens=max_new,
                max_prompt_tokens=max_prompt,
                eos_id=self.codec.eos_ids,
                **defaults,
            )
        assert model is not None  # the PyTorch decoder runs our own model
        return Decoder(
            model,
            slots=self.slots,
            max_new_tokens=max_new,
            max_prompt_tokens=max_prompt,
            eos_id=self.codec.eos_ids,
            pad_id=self.codec.pad_id,
            **defaults,
            seed=cfg.run.seed + (self.ctx.index or 0),
            version=self.loaded,
            cuda_graphs=cfg.backends.cuda_graphs,
            # Validation's rollouts are never trained: they need no routes.
            record_routes=cfg.algorithm.router_replay.enabled and not greedy_only,
        )

    def _answer_served(self, finished: Finished) -> None:
        if self.serving is not None:
            self.serving.answer(finished)

    @property
    def decoder(self) -> Decoding:
        return self.episodes.decoder

    # --- versions ------------------------------------------------------------------------

    def on_version(self, version: int) -> int | None:
        # The model runs on the receiver's checked buffer itself (no copy); in-flight
        # sequences carry on, their caches recomputed at the next step.
        moved = self.weights.follow(
            version, self.loaded, lambda got: self.decoder.load(got.state, got.version, copy=False)
        )
        if moved is not None:
            self.loaded, cost = moved
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
        # The decoder's model changes under training: validation decodes a frozen copy.
        # Another engine holds one set of weights: validation shares it, and a response
        # that spans a new version is scored as it came out.
        frozen = copy.deepcopy(self.model) if self.engine is None else None
        episodes = self._episodes(frozen, greedy_only=True)
        samples = validation_samples(self.task, self.ctx.config.data.val_prompts)
        for i, sample in enumerate(samples):
            episodes.begin(i, sample, tuple(self.codec.encode(sample.prompt)), greedy=True)
        self.validation = _Validation(self.loaded, episodes, samples, time.monotonic())

    # --- leases --------------------------------------------------------------------------

    def capacity(self) -> int:
        if self.serves_only:
            # The harnesses hold the generate stage, so no claim brings a lease; claiming
            # now and then is how a serving generator hears that the run is over.
            return 1
        return max(0, self.decoder.free_slots // self.n)

    @property
    def busy(self) -> bool:
        serving = self.serving is not None and self.serving.busy
        return bool(self.running) or self.validation is not None or serving

    def wake_within_s(self) -> float | None:
        return None if self.serving is None else SERVE_POLL_S

    def admit(self, lease: p.Lease) -> None:
        self.running[lease.lease_id] = _Running(lease, waiting=len(lease.items) * self.n)
        for item in lease.items:
            prompt = PromptIn.of(item)
            sample = prompt.sample()
            encoded = tuple(self.codec.encode(prompt.prompt))
            for j in range(self.n):
                self.episodes.begin((lease.lease_id, item.gid, j), sample, encoded)

    def advance(self) -> list[tuple[p.Lease, Outcome]]:
        if self.serves_only:  # no leases: the decoder holds harnesses' calls only
            self.serving.advance(self.decoder)
            self._advance_validation()
            return []
        if self.serving is not None:  # a judge's calls, in the same batch as the leases'
            self.serving.feed(self.decoder)
        finished, failed = self.episodes.step()
        for (lease_id, gid, _), reason in failed:
            self._fail_group(self.running[lease_id], gid, reason)
        if self.episodes.stuck >= _MAX_STUCK:
            raise ActorBroken(f"{self.episodes.stuck} environment calls stuck past their time")
        for episode in finished:
            lease_id, gid, j = episode.tag
            running = self.running[lease_id]
            if gid in running.failed:
                continue  # counted when its group failed
            running.rows.setdefault(gid, {})[j] = episode
            running.waiting -= 1
        done = []
        for lease_id, running in list(self.running.items()):
            if running.waiting == 0:
                del self.running[lease_id]
                done.append((running.lease, self._outcome(running)))
        self._advance_validation()
        return done

    def _fail_group(self, running: _Running, gid: int, reason: str) -> None:
        """One trajectory failed: its group fails, its siblings stop where they are."""
        if gid in running.failed:
            return
        running.failed[gid] = reason
        lease_id = running.lease.lease_id
        finished = running.rows.pop(gid, {})
        siblings = [(lease_id, gid, j) for j in range(self.n) if j not in finished]
        self.episodes.cancel(siblings)
        running.waiting -= len(siblings)  # the one that failed is among them

    def abandon(self) -> list[p.Lease]:
        leases = [running.lease for running in self.running.values()]
        self.running.clear()
        if self.validation is not None:
            self.validation.episodes.decoder.close()
        self.validation = None  # measured again at the next due version
        self.decoder.close()  # an engine's requests would go on sampling otherwise
        self.episodes = self._episodes(self.model, greedy_only=False)
        if self.serving is not None:
            self.serving.dropped("its decode step failed")
        return leases

    def _outcome(self, running: _Running) -> Outcome:
        results, tokens = [], 0
        for item in running.lease.items:
            if item.gid in running.failed:
                continue
            rows = [episode for _, episode in sorted(running.rows[item.gid].items())]
            sequences = [
                Sampled(e.tokens, e.logprobs, e.versions, e.trained, e.truncated, owner, e.routes)
                for owner, e in enumerate(rows)
            ]
            rewards = None if self.environment is None else [e.reward for e in rows]
            try:
                rollouts = RolloutsOut.from_sequences(sequences, rewards)
            except ValueError as error:  # e.g. an environment whose resets share no token
                running.failed[item.gid] = f"group of sequences refused: {error}"
                continue
            tokens += rollouts.trained_tokens()
            results.append(p.Result(item.gid, rollouts.to_payload(), rollouts.behaviour()))
        failed = tuple(sorted(running.failed.items()))
        return Outcome(tuple(results), tokens=tokens, failed=failed)

    # --- validation ----------------------------------------------------------------------

    def _advance_validation(self) -> None:
        v = self.validation
        if v is None:
            return
        finished, failed = v.episodes.step()
        for _, reason in failed:
            log.warning("validation episode failed", version=v.version, reason=reason)
            v.rewards.append(0.0)
            v.errors += 1
        for episode in finished:
            v.rewards.append(self._validation_reward(v, episode))
        if v.episodes.busy:
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

    def _validation_reward(self, v: _Validation, episode: EpisodeDone) -> float:
        if episode.reward is not None:
            return episode.reward  # what the environment paid
        try:
            return self.reward(v.samples[episode.tag], self.codec.decode(episode.last_turn))
        except TaskError as error:
            log.warning("validation reward failed", version=v.version, reason=str(error))
            v.errors += 1
            return 0.0

    def on_stop(self) -> None:
        if self.serving is not None:
            self.serving.stop()
        self.weights.receiver.close()
        if self.engine is not None:
            self.engine.close()

    def take_reports(self) -> list[p.Report]:
        reports, self.reports = self.reports, []
        return reports
