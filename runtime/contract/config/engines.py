"""The sections that say how a run's work is carried: the weight plane, the data plane,
the engines (the fields' metadata: fields.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .fields import doc


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
    stall_warning_s: float = field(
        default=120.0,
        metadata=doc(
            "seconds a generator may go without loading a version while newer ones are "
            "published before the terminal says so, naming its source and why it failed",
            exclusive_min=0,
        ),
    )
    stall_stop_s: float = field(
        default=600.0,
        metadata=doc(
            "seconds without a version, while newer ones are published, after which the "
            "generator stops the run with that error (past stall_warning_s)",
            exclusive_min=0,
        ),
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
    from_every_rank: bool = field(
        default=True,
        metadata=doc(
            "a split group's ranks (train, critic: FSDP2 on the torch engine; train: "
            "megatron's ranks of one copy of the model; no LoRA) each publish their own "
            "slice of a version, fetched by receivers from every rank (or a relay) at once "
            "and assembled: no rank gathers the whole model, each host sends its own bytes; "
            "false, or other groups: rank 0 gathers and publishes"
        ),
    )
    shm_dir: str = field(
        default="",
        metadata=doc(
            "where shm and map_on_host keep staged versions; empty = a directory per run "
            "in /dev/shm"
        ),
    )

    def __post_init__(self) -> None:
        # The warning comes first: a run that stops must have said why on the terminal.
        if self.stall_stop_s <= self.stall_warning_s:
            raise ValueError(
                f"stall_stop_s: got {self.stall_stop_s:g} with weights.stall_warning_s="
                f"{self.stall_warning_s:g}; allowed: more than weights.stall_warning_s"
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
class VLLMSection:
    """How the vLLM engine (``backends.generate=vllm``) is set up in each generate worker."""

    kv_cache_gib: float = field(
        default=1.0,
        metadata=doc(
            "memory each generate worker's engine keeps for its paged KV cache, in GiB",
            exclusive_min=0,
        ),
    )
    block_size: int = field(
        default=32,
        metadata=doc(
            "tokens per KV-cache page; prefix caching shares whole pages (on CPU vLLM's "
            "attention takes multiples of 32)",
            min=1,
        ),
    )
    tensor_parallel_size: int = field(
        default=1,
        metadata=doc(
            "ranks one engine's model is split over, each a process of vLLM's that ends "
            "with its generate worker (2 ranks ran on CPU; never run on GPUs)",
            min=1,
        ),
    )

    def __post_init__(self) -> None:
        if self.block_size % 32:
            raise ValueError(
                f"block_size: got {self.block_size}; allowed: a multiple of 32 (vLLM's "
                "attention on CPU takes no other)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendsSection:
    generate: Literal["torch", "sglang", "vllm"] = field(
        default="torch",
        metadata=doc(
            "generation engine: torch (our own decoder), vllm (vLLM, on CPU or CUDA; "
            "installed by deploy/install-vllm.sh) or sglang (CUDA only)"
        ),
    )
    train: Literal["torch", "megatron"] = field(default="torch", metadata=doc("training engine"))
    cpu_threads: int = field(
        default=1,
        metadata=doc(
            "torch threads per worker process on CPU; 0 = automatic: in a synchronous run "
            "(pipeline.max_staleness 0) generate, values, critic and train take turns, so "
            "each gets this machine's cores shared among its workers; 1 for every other role "
            "and run",
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
    vllm: VLLMSection = field(
        default_factory=VLLMSection,
        metadata=doc("the vLLM engine of backends.generate=vllm"),
    )
    megatron: MegatronSection = field(
        default_factory=MegatronSection,
        metadata=doc(
            "how the megatron-core engine (backends.train=megatron) splits the model over a "
            "group of ranks: the trainer's, and logp's or ref_logp's when it has several"
        ),
    )
