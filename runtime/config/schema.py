"""Typed, frozen sections of a run's configuration.

Each constraint is declared once, in the field's metadata, and the generic loader
(`load.py`) enforces it and words the error from it:

- "help": one line shown by `describe_fields` and the CLI;
- "min" / "max": inclusive bounds; "exclusive_min": a strict lower bound;
- "keys": the only keys a mapping field may have;
- "one_or_list": a list field that also takes one value, as a list of one.

For mapping and list fields the bounds apply to each value. A check across fields goes in
the section's `__post_init__` as `ValueError("<field>: got ...; allowed: ...")`; the loader
prefixes the section's dotted path. Every field has a default, so an empty YAML file is a
valid config: the embedded CPU demo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from asyncrl.runtime.core.pipeline import DEFAULT_PIPELINE, Role

# Every role a derived pipeline may have, in data-flow order (the harness role last: only
# runs with data.harness have it); `pipeline.workers` may name only these.
WORKER_ROLES = (*DEFAULT_PIPELINE.worker_roles, Role.HARNESS.value)


def doc(text: str, **limits: Any) -> dict[str, Any]:
    """Field metadata: one-line help plus limits (see the module docstring)."""
    return {"help": text, **limits}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSection:
    name: str = field(
        default="arithmetic", metadata=doc("name of the run; fills {name} in run.dir")
    )
    dir: str = field(
        default="runs/{name}", metadata=doc("run directory: journal, checkpoints, resolved config")
    )
    seed: int = field(
        default=0, metadata=doc("seed for every random number generator of the run", min=0)
    )
    total_steps: int = field(
        default=300, metadata=doc("optimizer steps before the run ends", min=1)
    )

    def __post_init__(self) -> None:
        # Expanded here, after overrides are merged, so `run.name=x` alone moves the dir.
        # str.replace, not str.format: other braces in a path are left alone.
        object.__setattr__(self, "dir", self.dir.replace("{name}", self.name))


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSection:
    task: str = field(
        default="asyncrl.actors.tasks.arithmetic:task",
        metadata=doc("task plug-in, as an import path module:attr"),
    )
    reward: str = field(
        default="",
        metadata=doc(
            "reward: f(sample, response) -> float as module:attr, 'math' (math-verify), "
            "'model:DIR' (a sequence classifier), or 'judge:module:attr' (an async judge "
            "asking the policy through the generators' API); empty: the task's own (with "
            "data files: math)"
        ),
    )
    reward_timeout_s: float = field(
        default=30.0,
        metadata=doc(
            "a reward call still running after this long fails its group; 0 = no limit", min=0
        ),
    )
    train_files: list[str] = field(
        default_factory=list,
        metadata=doc(
            "JSONL or Parquet files of chat prompts (verl's layout) to train on instead of "
            "data.task; one path or a list",
            one_or_list=True,
        ),
    )
    val_files: list[str] = field(
        default_factory=list,
        metadata=doc("the validation rows that go with data.train_files", one_or_list=True),
    )
    environment: str = field(
        default="",
        metadata=doc(
            "multi-turn environment plug-in (module:attr, a class with reset(sample) and "
            "step(action)), one per trajectory; it pays the reward; empty: single-turn"
        ),
    )
    max_turns: int = field(
        default=4, metadata=doc("model turns per trajectory with an environment", min=1)
    )
    max_total_tokens: int = field(
        default=0,
        metadata=doc(
            "tokens per trajectory with an environment: prompt, turns and observations; "
            "0 = model.max_prompt_tokens + model.max_new_tokens",
            min=0,
        ),
    )
    env_step_timeout_s: float = field(
        default=30.0,
        metadata=doc(
            "an environment's reset or step still running after this long fails its group; "
            "0 = no limit",
            min=0,
        ),
    )
    group_size: int = field(
        default=8, metadata=doc("responses sampled per prompt (one group)", min=1)
    )
    val_every_versions: int = field(
        default=10,
        metadata=doc("validate every this many weight versions; 0 = never validate", min=0),
    )
    val_prompts: int = field(default=128, metadata=doc("prompts per validation pass", min=1))
    harness: str = field(
        default="",
        metadata=doc(
            "agent harness as module:attr, an async function run(sample, client) -> reward "
            "given an openai.AsyncOpenAI client bound to one rollout session; empty: none "
            "(the generators sample the task's prompts themselves)"
        ),
    )
    harness_concurrency: int = field(
        default=32, metadata=doc("harness sessions in flight per harness worker", min=1)
    )
    harness_timeout_s: float = field(
        default=300.0,
        metadata=doc(
            "a harness session still running after this long fails its group", exclusive_min=0
        ),
    )
    harness_host: str = field(
        default="127.0.0.1",
        metadata=doc(
            "address the generators serve the OpenAI-compatible API on for harnesses "
            "(each on a free port)"
        ),
    )

    def __post_init__(self) -> None:
        # Validation would otherwise quietly score prompts of data.task, another workload.
        if self.train_files and not self.val_files and self.val_every_versions > 0:
            raise ValueError(
                "val_files: got none with data.train_files set; allowed: the validation "
                "files, or data.val_every_versions=0"
            )
        # The environment pays the reward; a reward function too would be silently unused.
        if self.environment and self.reward:
            raise ValueError(
                f"reward: got {self.reward!r} with data.environment set; allowed: empty "
                "(the environment's step rewards are the reward)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSection:
    path: str = field(
        default="embedded",
        metadata=doc(
            "model directory, or a packaged model: 'embedded' (the demo's), "
            "'embedded-long' (up to 30 digits) or 'embedded-calculator' (the calculator "
            "task's)"
        ),
    )
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32",
        metadata=doc(
            "compute dtype, and the weights of generate, logp and ref_logp, of what the "
            "trainer publishes and of checkpoints; the trainer keeps float32 master weights"
        ),
    )
    max_new_tokens: int = field(
        default=80, metadata=doc("most tokens generated per response", min=1)
    )
    max_prompt_tokens: int = field(
        default=512,
        metadata=doc(
            "longest prompt the generator takes (its KV cache holds this plus "
            "max_new_tokens per sequence; at most the model's positions)",
            min=1,
        ),
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata=doc(
            "train: recompute each layer's activations in the backward pass instead of "
            "keeping them (far less memory, about a third more compute)"
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AlgorithmSection:
    estimator: Literal["grpo", "dr_grpo"] = field(
        default="grpo", metadata=doc("group advantage estimator")
    )
    # Suits the small embedded model; billion-parameter models want about 1e-6.
    lr: float = field(default=2e-4, metadata=doc("learning rate", exclusive_min=0))
    clip_low: float = field(
        default=0.2, metadata=doc("PPO ratio clip below 1 (1 - clip_low)", min=0)
    )
    clip_high: float = field(
        default=0.28, metadata=doc("PPO ratio clip above 1 (1 + clip_high)", min=0)
    )
    kl_coef: float = field(
        default=0.0,
        metadata=doc(
            "weight of the KL penalty to the reference model; 0: no penalty, and no "
            "ref_logp stage runs",
            min=0,
        ),
    )
    kl_estimator: Literal["k1", "k3"] = field(default="k3", metadata=doc("KL estimator"))
    loss_agg: Literal["token", "sequence"] = field(
        default="token", metadata=doc("average the loss per token or per sequence")
    )
    is_cap: float = field(
        default=5.0, metadata=doc("cap on the behaviour/proximal importance weight", min=1)
    )
    proximal_logp: Literal["auto", "recompute"] = field(
        default="auto",
        metadata=doc(
            "auto: logp reuses the generator's log-probs for a group generated wholly by the "
            "version it holds (same model code and weights: they agree to about 1e-7), and "
            "scores the rest; with backends.generate or backends.train other than torch it "
            "always scores; "
            "recompute: always score"
        ),
    )
    max_grad_norm: float = field(default=1.0, metadata=doc("gradient norm clip", exclusive_min=0))
    # Measured for the embedded model on one CPU thread: a step's forward and backward
    # took 0.32 s in micro-batches of 4 groups (32 sequences), 0.26 s in 2 and 1 (their
    # activations stay in cache); the gradient is the same sum either way.
    micro_batch_groups: int = field(
        default=2,
        metadata=doc(
            "most sequences per micro-batch (gradient accumulation), as this many groups "
            "of the step's longest would pad to; rows of like length share one",
            min=1,
        ),
    )
    temperature: float = field(default=1.0, metadata=doc("sampling temperature", exclusive_min=0))


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSection:
    max_staleness: int = field(
        default=2,
        metadata=doc(
            "weight versions a sample may lag the trainer; 0 = synchronous on-policy", min=0
        ),
    )
    train_batch_groups: int = field(default=8, metadata=doc("groups per optimizer step", min=1))
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
        default=50, metadata=doc("optimizer steps between checkpoints", min=1)
    )
    actors: str = field(
        default="asyncrl.actors.roles",
        metadata=doc("module whose ROLES maps each role to its worker class (an import path)"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsSection:
    strategy: Literal["ucx", "shm", "files"] = field(
        default="ucx",
        metadata=doc(
            "how new weights reach generators (ucx: checksummed buckets from the trainer's "
            "CPU buffers, relayed between generators; shm: generators on the trainer's host "
            "map its staged buffer; files: safetensors in run.dir/weights)"
        ),
    )
    produce_bucket_mb: int = field(
        default=64, metadata=doc("MiB per checksummed bucket when publishing weights", min=1)
    )
    consume_bucket_mb: int = field(
        default=64, metadata=doc("MiB a receiver asks for at a time", min=1)
    )
    progress_mode: Literal["thread", "polling"] = field(
        default="thread",
        metadata=doc("how transfers make progress (polling: faster, keeps a core busy)"),
    )
    stall_timeout_s: float = field(
        default=10.0,
        metadata=doc("seconds without progress before a weight source counts as failed", min=0.1),
    )
    relay_fanout: int = field(
        default=2,
        metadata=doc(
            "receivers each node relays to; 0 = every receiver pulls from the trainer", min=0
        ),
    )
    map_on_host: bool = field(
        default=True,
        metadata=doc(
            "ucx: the trainer stages into shared-memory files, which generators on its host "
            "map instead of fetching (generators elsewhere fetch over UCX)"
        ),
    )
    shm_dir: str = field(
        default="",
        metadata=doc(
            "where shm and map_on_host keep staged versions; empty = a directory per run "
            "in /dev/shm"
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadsSection:
    inline_bytes: int = field(
        default=1024,
        metadata=doc(
            "a role's result for a group up to this many packed bytes travels inline "
            "through the scheduler; a larger one stays with the worker that made it and "
            "its readers fetch it from there",
            min=0,
        ),
    )
    fetch_timeout_s: float = field(
        default=10.0,
        metadata=doc(
            "seconds a reader waits for a holder before its payload counts as lost and is "
            "made again",
            exclusive_min=0,
        ),
    )
    host: str = field(
        default="",
        metadata=doc(
            "address this host's workers serve payloads on; empty = the one that reaches "
            "the scheduler"
        ),
    )
    shared_memory: bool = field(
        default=True,
        metadata=doc(
            "keep payloads in /dev/shm, so that readers on the holder's host map them "
            "instead of fetching them (readers elsewhere fetch over ZeroMQ)"
        ),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class MegatronSection:
    """How megatron-core splits the model over a role's group (``backends.train=megatron``)."""

    tensor_parallel: int = field(
        default=1,
        metadata=doc(
            "ranks each layer's weight matrices are split over (heads, MLP, vocab)", min=1
        ),
    )
    pipeline_parallel: int = field(
        default=1,
        metadata=doc(
            "stages the layers are split into, in even blocks (the model's layer count must "
            "divide by it); each stage is tensor_parallel ranks, and the last one computes "
            "the log-probs and the loss",
            min=1,
        ),
    )
    expert_parallel: int = field(
        default=1,
        metadata=doc("ranks a mixture-of-experts layer's experts are spread over", min=1),
    )
    distributed_optimizer: bool = field(
        default=True,
        metadata=doc(
            "with several data-parallel copies, AdamW's state is split among them: each "
            "rank keeps and updates its share of the parameters, gradients are reduced to "
            "it and the new values broadcast (false: every copy keeps the whole state)"
        ),
    )

    @property
    def model_parallel(self) -> int:
        """Ranks that hold one copy of the model between them (expert ranks come out of
        the data-parallel ones, so they count here too: the group must have them)."""
        return self.tensor_parallel * self.pipeline_parallel * self.expert_parallel


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendsSection:
    generate: Literal["torch", "sglang"] = field(default="torch", metadata=doc("generation engine"))
    train: Literal["torch", "megatron"] = field(default="torch", metadata=doc("training engine"))
    cpu_threads: int = field(
        default=1,
        metadata=doc(
            "torch threads per worker process on CPU; 0 = automatic: in a synchronous run "
            "(pipeline.max_staleness 0) generate and train take turns, so each gets this "
            "machine's cores shared among its workers; 1 for every other role and run",
            min=0,
        ),
    )
    device: Literal["cpu", "cuda"] = field(
        default="cpu",
        metadata=doc(
            "where models compute: cpu, or cuda (each worker on the device its rank or index "
            "picks; bfloat16 weights with log-probs, advantages and loss in float32)"
        ),
    )
    cuda_graphs: bool = field(
        default=True,
        metadata=doc(
            "with device cuda, the torch generate engine replays each decode step of one "
            "new token per sequence from a CUDA graph (one per batch size, powers of two; "
            "a mixture-of-experts model never is); false to launch every kernel instead"
        ),
    )
    collective_timeout_s: float = field(
        default=300.0,
        metadata=doc(
            "a training group's ranks (pipeline.workers.train > 1) give up on a collective "
            "after this long, and the group starts afresh",
            exclusive_min=0,
        ),
    )
    megatron: MegatronSection = field(
        default_factory=MegatronSection,
        metadata=doc(
            "how the megatron-core engine (backends.train=megatron) splits the model over a "
            "group of ranks: the trainer's, and logp's or ref_logp's when it has several"
        ),
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
        default="auto", metadata=doc("CurveZMQ encryption; auto = on unless the host is loopback")
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

    def __post_init__(self) -> None:
        _check_megatron_group(self.backends, self.pipeline)


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
