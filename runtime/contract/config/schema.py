"""A run's configuration: one typed, frozen tree of sections, `RunConfig`.

What a run learns from is in data.py (data), how it learns in learning.py (model,
algorithm, critic; their recipes in recipes.py), how its work is carried in engines.py
(weights, payloads, backends and megatron), and the rest here (run, pipeline,
scheduler, logging). Each field declares its constraints in its
metadata (fields.py says how); the generic loader (`load.py`) enforces them. Every field
has a default, so an empty YAML file is a valid config: the embedded CPU demo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.runtime.contract.stages import DEFAULT_PIPELINE, Role

from .data import DataSection
from .engines import BackendsSection, PayloadsSection, WeightsSection
from .fields import doc
from .learning import AlgorithmSection, CriticSection, ModelSection
from .placement import PlacementSection

# Every role a derived pipeline may have, in data-flow order (the harness role last: only
# runs with data.harness have it); `pipeline.workers` may name only these.
WORKER_ROLES = (
    *DEFAULT_PIPELINE.worker_roles,
    Role.VALUES.value,
    Role.CRITIC.value,
    Role.HARNESS.value,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSection:
    name: str = field(
        default="arithmetic",
        metadata=doc("name of the run; fills {name} in run.dir", one_line=True),
    )
    dir: str = field(
        default="runs/{name}",
        metadata=doc("run directory: journal, checkpoints, resolved config", one_line=True),
    )
    seed: int = field(
        default=0, metadata=doc("seed for every random number generator of the run", min=0)
    )
    total_steps: int = field(
        default=300,
        metadata=doc(
            "train steps before the run ends: batches, each one new version (a step takes "
            "algorithm.mini_batches x algorithm.epochs optimizer steps)",
            min=1,
        ),
    )
    keep_checkpoints: int = field(
        default=3,
        metadata=doc(
            "newest checkpoints kept of the trainer's (and of a learned critic's); older "
            "ones are deleted as new ones are written; 0 = keep every one",
            min=0,
        ),
    )
    dump_rollouts: bool = field(
        default=False,
        metadata=doc(
            "write every trained sample (and every sample of a filtered group) as a JSON "
            "line under the run directory's rollouts/: prompt and response text and ids, "
            "reward and its parts, advantage, versions, group and step",
        ),
    )

    def __post_init__(self) -> None:
        # Expanded here, after overrides are merged, so `run.name=x` alone moves the dir.
        # str.replace, not str.format: other braces in a path are left alone.
        object.__setattr__(self, "dir", self.dir.replace("{name}", self.name))
        if self.keep_checkpoints == 1:
            raise ValueError(
                "keep_checkpoints: got 1; allowed: 0 (every one) or 2 and more (a trainer "
                "killed as it wrote the newest may need the one before)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSection:
    max_staleness: int = field(
        default=2,
        metadata=doc(
            "weight versions a sample may lag the trainer; 0 = synchronous on-policy", min=0
        ),
    )
    train_batch_groups: int = field(default=8, metadata=doc("groups per train step", min=1))
    max_attempts: int = field(default=3, metadata=doc("tries per task before it is failed", min=1))
    lease_timeout_s: float = field(
        default=60.0,
        metadata=doc("seconds before an unfinished lease is re-issued", exclusive_min=0),
    )
    workers: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(WORKER_ROLES, 1),
        metadata=doc(
            "workers per role; roles not given keep their default", min=0, keys=WORKER_ROLES
        ),
    )
    checkpoint_every: int = field(
        default=50, metadata=doc("train steps between checkpoints", min=1)
    )
    actors: str = field(
        default="asyncrl.actors.roles",
        metadata=doc("module whose ROLES maps each role to its worker class (an import path)"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSection:
    host: str = field(
        default="127.0.0.1", metadata=doc("address the scheduler binds and workers dial")
    )
    local_ipc: bool = field(
        default=True,
        metadata=doc(
            "asyncrl run on a loopback host: the bus on ipc:// sockets in a directory only "
            "this user can open, instead of loopback TCP that every local user can reach"
        ),
    )
    control_port: int = field(
        default=5555, metadata=doc("port for requests; 0 = any free port", min=0, max=65535)
    )
    events_port: int = field(
        default=5556, metadata=doc("port for published events; 0 = any free port", min=0, max=65535)
    )
    heartbeat_interval_s: float = field(
        default=2.0, metadata=doc("seconds between worker heartbeats", exclusive_min=0)
    )
    worker_timeout_s: float = field(
        default=15.0, metadata=doc("silence after which a worker is dead", exclusive_min=0)
    )
    resources: dict[str, int] = field(
        default_factory=dict, metadata=doc("named lock resources and their capacity", min=1)
    )
    journal_fsync_every: int = field(
        default=256, metadata=doc("journal records per batched fsync", min=1)
    )
    journal_fsync_interval_ms: int = field(
        default=50, metadata=doc("longest wait before a batched fsync", min=0)
    )
    snapshot_every: int = field(
        default=10000, metadata=doc("journal records between snapshots", min=1)
    )
    max_message_mb: int = field(default=64, metadata=doc("largest accepted message, MiB", min=1))
    ack_after: Literal["write", "fsync"] = field(
        default="write",
        metadata=doc("acknowledge results once journaled to the OS, or only once fsynced"),
    )
    busy_poll_us: int = field(
        default=200,
        metadata=doc(
            "after serving, the scheduler checks for the next request this long without "
            "sleeping (a woken core costs more than a round trip on a VM; spinning costs CPU)",
            min=0,
        ),
    )
    worker_busy_poll_us: int = field(
        default=0,
        metadata=doc(
            "a worker checks for its reply this long without sleeping (off: with the "
            "scheduler spinning too, the two spinners slowed each other on 2 cores)",
            min=0,
        ),
    )
    curve: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata=doc(
            "CurveZMQ encryption; auto = on for every TCP endpoint, loopback included "
            "(ipc:// is closed to other users by its directory's modes)"
        ),
    )
    keys_dir: str = field(
        default="{run.dir}/keys",
        metadata=doc("CurveZMQ keys from `asyncrl-scheduler keygen DIR`"),
    )
    metrics_port: int = field(
        default=0,
        metadata=doc(
            "serve Prometheus metrics over HTTP on this port (needs the metrics extra); 0 = off",
            min=0,
            max=65535,
        ),
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata=doc("address the metrics endpoint binds (loopback: this host only)"),
    )

    def __post_init__(self) -> None:
        # Two sockets cannot bind one port; both 0 lets the OS pick two free ones.
        if self.control_port == self.events_port != 0:
            raise ValueError(
                f"events_port: got {self.events_port}, the same as control_port; "
                "allowed: a port other than control_port, or both 0"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingSection:
    level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata=doc("lowest level logged")
    )
    format: Literal["json", "console"] = field(
        default="json", metadata=doc("json lines, or coloured console text")
    )
    backends: tuple[Literal["jsonl", "tensorboard", "wandb"], ...] = field(
        default=("jsonl",),
        metadata=doc(
            "where step metrics go besides metrics.jsonl (always written): tensorboard "
            "(run.dir/tensorboard), wandb (offline, run.dir/wandb); each needs its extra"
        ),
    )
    trace: bool = field(
        default=True,
        metadata=doc("write run.dir/trace.json: every lease, weight version and train step"),
    )
    file_mb: int = field(
        default=32,
        metadata=doc("a process's log file (run.dir/logs/NAME.log) is rotated at this size", min=1),
    )
    files_kept: int = field(
        default=3,
        metadata=doc("rotated log files kept per process (NAME.log.1 is the newest)", min=1),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    run: RunSection = field(
        default_factory=RunSection, metadata=doc("identity, directory and length of the run")
    )
    data: DataSection = field(
        default_factory=DataSection, metadata=doc("task and sampling of prompts")
    )
    model: ModelSection = field(default_factory=ModelSection, metadata=doc("policy model"))
    algorithm: AlgorithmSection = field(
        default_factory=AlgorithmSection, metadata=doc("loss and optimizer")
    )
    critic: CriticSection = field(
        default_factory=CriticSection,
        metadata=doc("the learned critic of algorithm.estimator=gae (PPO)"),
    )
    pipeline: PipelineSection = field(
        default_factory=PipelineSection, metadata=doc("asynchronous pipeline and workers")
    )
    weights: WeightsSection = field(
        default_factory=WeightsSection, metadata=doc("weight transfer to generators")
    )
    payloads: PayloadsSection = field(
        default_factory=PayloadsSection,
        metadata=doc("where role results live between stages (the data plane)"),
    )
    backends: BackendsSection = field(
        default_factory=BackendsSection, metadata=doc("generation and training engines")
    )
    scheduler: SchedulerSection = field(
        default_factory=SchedulerSection, metadata=doc("scheduler service and journal")
    )
    logging: LoggingSection = field(default_factory=LoggingSection, metadata=doc("log output"))
    placement: PlacementSection = field(
        default_factory=PlacementSection,
        metadata=doc("what runs where on a cluster (asyncrl launch)"),
    )

    def weight_parts(self, learner: str) -> int:
        """How many parts each version of ``learner`` (train, critic) comes in: one per
        publishing rank of its group where every rank publishes its own
        (``weights.from_every_rank``), else 1 (rank 0 publishes it whole). The torch
        engine's ranks publish their FSDP2 rows; the trainer's megatron ranks of one copy
        of the model their tensor-parallel slices of their stage's layers and their
        experts (each data-parallel copy but the first publishes nothing). Published
        whole: LoRA versions (the adapters, gathered whole, which are small)."""
        ranks = self.pipeline.workers.get(learner, 1)
        if ranks < 2 or not self.weights.from_every_rank or self.model.lora.enabled:
            return 1
        if self.backends.train == "torch":
            return ranks
        if learner != "train":
            return 1
        return self.backends.megatron.model_parallel

    def __post_init__(self) -> None:
        _check_megatron_group(self.backends, self.pipeline)
        _check_estimator(self.algorithm, self.data)
        _check_filter_groups(self.algorithm, self.data)
        _check_overlong(self.algorithm, self.model)
        _check_lora_engines(self)
        _check_mini_batches(self.algorithm, self.pipeline)
        _check_proximal_from_trainer(self)


def _check_filter_groups(algorithm: AlgorithmSection, data: DataSection) -> None:
    rule = algorithm.filter_groups
    if rule.enabled and data.group_size < 2:
        # The std of one response is 0: every group would be filtered and nothing trained.
        raise ValueError(
            f"algorithm.filter_groups.enabled: got true with data.group_size={data.group_size}; "
            "allowed: data.group_size >= 2 (one response has no spread, so every group "
            "would be filtered)"
        )


def _check_estimator(algorithm: AlgorithmSection, data: DataSection) -> None:
    """An estimator's needs that another section decides."""
    if algorithm.estimator == "rloo" and data.group_size < 2:
        # The leave-one-out baseline of a group of one is the mean of no response.
        raise ValueError(
            f"algorithm.estimator: got 'rloo' with data.group_size={data.group_size}; "
            "allowed: data.group_size >= 2, or another estimator"
        )


def _check_mini_batches(algorithm: AlgorithmSection, pipeline: PipelineSection) -> None:
    """A train step's batch is split by groups, the same number in every mini-batch."""
    if pipeline.train_batch_groups % algorithm.mini_batches:
        raise ValueError(
            f"algorithm.mini_batches: got {algorithm.mini_batches}, which does not divide "
            f"pipeline.train_batch_groups={pipeline.train_batch_groups}; allowed: a divisor "
            "of the groups per train step"
        )


def _check_proximal_from_trainer(cfg: RunConfig) -> None:
    """``algorithm.proximal_logp: trainer`` reads the proximal log-probs from the update's
    forward pass, which are the step's starting weights' only in the first update, and
    which come after the corrections must know what they reject; and it takes the
    generator's log-probs as its own numbers, as logp's reuse does."""
    a = cfg.algorithm
    if a.proximal_logp != "trainer":
        return
    needs = []
    if a.mini_batches * a.epochs != 1:
        needs.append(
            f"one update per step (algorithm.mini_batches={a.mini_batches}, "
            f"algorithm.epochs={a.epochs}; both 1)"
        )
    rejecting = [
        f"algorithm.correction.{name}.reject={part.reject}"
        for name, part in (("offpolicy", a.correction.offpolicy), ("engine", a.correction.engine))
        if part.reject != "none"
    ]
    if rejecting:
        needs.append(f"no rejection ({', '.join(rejecting)}; none)")
    if cfg.backends.generate != "torch" or cfg.backends.train != "torch":
        needs.append(
            f"the torch engine generating and training (backends.generate="
            f"{cfg.backends.generate}, backends.train={cfg.backends.train})"
        )
    if cfg.model.generator_dtype != cfg.model.dtype:
        needs.append(
            f"one dtype (model.generate_dtype={cfg.model.generator_dtype}, "
            f"model.dtype={cfg.model.dtype})"
        )
    if needs:
        raise ValueError(
            "algorithm.proximal_logp: got 'trainer', which needs "
            + "; ".join(needs)
            + "; allowed otherwise: auto or recompute (a logp stage scores the groups)"
        )


def _check_overlong(algorithm: AlgorithmSection, model: ModelSection) -> None:
    """The overlong buffer is the last part of the generation budget."""
    if algorithm.overlong_buffer >= model.max_new_tokens:
        raise ValueError(
            f"algorithm.overlong_buffer: got {algorithm.overlong_buffer} with "
            f"model.max_new_tokens={model.max_new_tokens}; allowed: fewer tokens than "
            "model.max_new_tokens (0 = off)"
        )


# vLLM's largest LoRA rank (0.32); smaller ranks are padded into its slots.
VLLM_MAX_LORA_RANK = 512


def _check_lora_engines(cfg: RunConfig) -> None:
    """Adapters are trained by the torch engine and merged by the torch scorer, holding
    the whole model (a scorer group would have to merge shards); the torch generator
    merges them too, and vLLM serves them as an adapter on its base."""
    lora = cfg.model.lora
    if not lora.enabled:
        return
    if cfg.backends.train != "torch" or cfg.backends.generate not in ("torch", "vllm"):
        raise ValueError(
            f"model.lora: got backends.train={cfg.backends.train!r}, backends.generate="
            f"{cfg.backends.generate!r}; allowed: backends.train 'torch' and "
            "backends.generate 'torch' or 'vllm' with adapters"
        )
    if cfg.backends.generate == "vllm" and lora.rank > VLLM_MAX_LORA_RANK:
        raise ValueError(
            f"model.lora.rank: got {lora.rank} with backends.generate='vllm'; allowed: up "
            f"to {VLLM_MAX_LORA_RANK}, the largest adapter vLLM serves"
        )
    if cfg.pipeline.workers.get("logp", 1) > 1:
        raise ValueError(
            f"model.lora: got pipeline.workers.logp={cfg.pipeline.workers['logp']}; allowed: "
            "1 with adapters (each logp worker merges a version onto its whole base)"
        )


def _check_megatron_group(backends: BackendsSection, pipeline: PipelineSection) -> None:
    """A group of megatron ranks (the trainer's; a scorer's) holds whole copies of the
    model's split."""
    if backends.train != "megatron":
        return  # the sizes are read only by the megatron engine
    m = backends.megatron
    for role in ("train", "logp", "ref_logp"):
        ranks = pipeline.workers.get(role, 1)
        # A scorer alone holds the whole model; a group of them is split like the trainer.
        if (role == "train" or ranks > 1) and ranks % m.model_parallel:
            raise ValueError(
                f"backends.megatron: got tensor_parallel={m.tensor_parallel} x "
                f"pipeline_parallel={m.pipeline_parallel} x expert_parallel="
                f"{m.expert_parallel} = {m.model_parallel} ranks, which does not divide "
                f"pipeline.workers.{role}={ranks}; allowed: sizes whose product divides "
                f"pipeline.workers.{role}"
            )
