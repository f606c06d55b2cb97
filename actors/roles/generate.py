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
versions, the generator with index 0 (or no index) decodes ``data.val_samples`` responses
to each prompt of every validation set with a frozen copy of that version, sampled by
``data.val_sampling`` (greedy by default), and reports mean@k, pass@k and more, per data
source and overall (:mod:`..evaluation`). When the run is over it validates the run's
last version before it leaves, and the scheduler waits for that report. With
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
from typing import ClassVar

import structlog

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p
from asyncrl.transport.weights import make_receiver

from ..actor import FINAL_VERSION_WAIT_S, ActorBroken, Outcome, StreamingActor, WorkerContext
from ..episodes import EpisodeDone, Episodes
from ..evaluation.passes import ValidationPass
from ..evaluation.sets import validation_sets
from ..payloads import PromptIn, RolloutsOut, Sampled
from ..policy.decoder import Decoder, Decoding, Finished
from ..policy.model import CausalLM
from ..serving.serving import Serving
from ..startup.decoding import DEFAULT_SLOTS, Generation
from ..startup.model_loading import load_policy, start_sglang, start_vllm
from ..startup.role_checks import check_device, check_engine, check_model, check_task
from ..startup.router_replay import router_replay_problems
from ..tasks.environment import load_environment, stop_ids
from ..worker.weight_following import StallBounds, WeightFollower, weights_access
from ..workload import load_workload, serves_api, validation_reward_for

__all__ = ["Generate"]

log = structlog.get_logger("asyncrl.generate")


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
        self.validation: ValidationPass | None = None
        self.finishing_since: float | None = None  # the run is over: the final validation
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
                cfg.weights,
                RunDir.of(cfg).weight_dirs(cfg.weights),
                weights_access(ctx),
                parts=cfg.weight_parts(Role.TRAIN.value),
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
        self.generation = Generation(
            cfg, self.engine, self.codec, self.model_config, self.slots, ctx.index
        )
        self.episodes = self._episodes(self.model)
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

    def _episodes(self, model: CausalLM | None, *, validation: bool = False) -> Episodes:
        decoder = self.generation.decoder(model, version=self.loaded, validation=validation)
        return self.generation.episodes(
            decoder,
            environment=self.environment,
            stop_ids=self.stop_ids,
            others=self._answer_served,
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
        if every == 0 or not self.validates or self.validation is not None:
            return
        last = self.last_validated
        if self.finishing_since is not None:
            # The run is over: its last version, once it is here (or the newest, if it
            # does not come), unless that one is validated already.
            here = self.loaded >= self._final_version or self._waited_out
            if last == self.loaded or not here:
                return
        elif last is not None and self.loaded // every <= last // every:
            return
        self.last_validated = self.loaded
        self.validation = self._validation_pass()

    def _validation_pass(self) -> ValidationPass:
        data = self.ctx.config.data
        # The decoder's model changes under training: validation decodes a frozen copy.
        # Another engine holds one set of weights: validation shares it, and a response
        # that spans a new version is scored as it came out.
        frozen = copy.deepcopy(self.model) if self.engine is None else None
        return ValidationPass(
            self.loaded,
            self._episodes(frozen, validation=True),
            validation_sets(self.task, data.val_prompts),
            samples=data.val_samples,
            greedy=data.val_sampling.greedy,
            reward=self.reward,
            encode=self.codec.encode,
            decode=self.codec.decode,
            threshold=data.val_pass_threshold,
        )

    def on_run_over(self) -> None:
        # Validation, if the run has it, goes on to the run's last version (lingers).
        self.finishing_since = time.monotonic()

    def lingers(self) -> bool:
        """The run is over and its last version's validation is still to come."""
        if self.finishing_since is None or self.ctx.config.data.val_every_versions == 0:
            return False
        if not self.validates:
            return False
        self._maybe_validate()  # the wait for the last version may be over
        if self.validation is not None:
            return True
        validated = self.last_validated == self.loaded
        return not (validated and (self.loaded >= self._final_version or self._waited_out))

    @property
    def _final_version(self) -> int:
        return self.ctx.config.run.total_steps

    @property
    def _waited_out(self) -> bool:
        """The run's last version has not come in time: the newest one will do."""
        since = self.finishing_since
        return since is not None and time.monotonic() - since >= FINAL_VERSION_WAIT_S

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
        # Measured again at the next due version; but at the end of the run the pass goes
        # on (it has its own decoder), to report the last version.
        if self.validation is not None and self.finishing_since is None:
            self.validation.close()
            self.validation = None
        self.decoder.close()  # an engine's requests would go on sampling otherwise
        self.episodes = self._episodes(self.model)
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
        v.step()
        if not v.done:
            return
        self.reports.append(p.Report(self.ctx.worker, "validation", v.version, v.metrics()))
        v.close()
        self.validation = None
        self._maybe_validate()  # at the end of the run, the last version may be next

    def on_stop(self) -> None:
        decoder = self.decoder
        if isinstance(decoder, Decoder):
            # What kept caches saved (a conversation's later turns reuse the earlier ones').
            log.info(
                "prompt tokens decoded",
                worker=self.ctx.worker,
                prompt_tokens=decoder.prompt_tokens,
                cached_prompt_tokens=decoder.cached_prompt_tokens,
                fed_tokens=decoder.fed_tokens,
            )
        if self.serving is not None:
            self.serving.stop()
        self.weights.receiver.close()
        if self.engine is not None:
            self.engine.close()

    def take_reports(self) -> list[p.Report]:
        reports, self.reports = self.reports, []
        return reports
