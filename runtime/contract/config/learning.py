"""The sections that say how a run learns: its model, its algorithm, its critic (the
fields' metadata: fields.py). What it learns from is data.py's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .fields import doc
from .recipes import (
    CorrectionsSection,
    FilterGroupsSection,
    RouterReplaySection,
    ScheduleSection,
)

__all__ = [
    "AlgorithmSection",
    "CriticSection",
    "Estimator",
    "ModelSection",
    "PolicyLoss",
    "Ratio",
]

# The advantage estimators and importance ratios a run may select, declared once: the
# loss functions (actors/rl) take their names from here.
Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"]
Ratio = Literal["token", "sequence"]
PolicyLoss = Literal["ppo", "cispo"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraSection:
    rank: int = field(
        default=0,
        metadata=doc(
            "rank of the low-rank adapters the trainer trains on a frozen base (versions "
            "are then the adapters alone); 0 = full fine-tuning",
            min=0,
        ),
    )
    alpha: float = field(
        default=16.0,
        metadata=doc(
            "adapter scale numerator: an adapter adds alpha / rank * B @ A", exclusive_min=0
        ),
    )
    dropout: float = field(
        default=0.0, metadata=doc("dropout on an adapter's input while training", min=0, max=1)
    )
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata=doc(
            "linear layers that get adapters, by name suffix (e.g. q_proj, gate_proj); "
            "one name or a list",
            one_or_list=True,
        ),
    )

    def __post_init__(self) -> None:
        if self.rank and not self.target_modules:
            raise ValueError("target_modules: got none with model.lora.rank set; allowed: names")
        # The output layer's forward also scores chosen tokens in chunks (model.py), which
        # an adapter's wrapper would not pass through.
        if "lm_head" in self.target_modules:
            raise ValueError("target_modules: got 'lm_head'; allowed: the decoder layers' linears")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSection:
    path: str = field(
        default="embedded",
        metadata=doc(
            "model directory, or a packaged model: 'embedded' (the demo's), "
            "'embedded-long' (up to 30 digits), 'embedded-calculator' (the calculator "
            "task's), 'embedded-agent' (the calculator as a chat model calling it as a "
            "tool) or 'embedded-code' (the code task's)"
        ),
    )
    dtype: Literal["float32", "bfloat16"] = field(
        default="float32",
        metadata=doc(
            "compute dtype, and the weights of generate, logp and ref_logp, of what the "
            "trainer publishes and of checkpoints; the trainer keeps float32 master weights"
        ),
    )
    generate_dtype: Literal["float32", "bfloat16"] | None = field(
        default=None,
        metadata=doc(
            "the generator's weights and compute dtype, null: model.dtype; another dtype "
            "than logp's makes the engine gap a serving engine in bfloat16 makes against "
            "a float32 trainer (logp then scores every group)"
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
    tool_parser: Literal["auto", "hermes", "llama3_json", "none"] = field(
        default="auto",
        metadata=doc(
            "how the served API reads tool calls in the model's text: hermes "
            "(<tool_call> blocks: Hermes, Qwen), llama3_json (Llama 3's JSON calls), none "
            "(tools offered, the response left as text), auto (told by the chat template's "
            "source; if it shows neither, a request with tools is refused)"
        ),
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata=doc(
            "train: recompute each layer's activations in the backward pass instead of "
            "keeping them (far less memory, about a third more compute)"
        ),
    )
    lora: LoraSection = field(
        default_factory=LoraSection,
        metadata=doc("train low-rank adapters on a frozen base instead of every weight"),
    )

    @property
    def generator_dtype(self) -> str:
        """The dtype the generator runs in: ``generate_dtype``, else ``dtype``."""
        return self.generate_dtype or self.dtype


@dataclass(frozen=True, slots=True, kw_only=True)
class AlgorithmSection:
    estimator: Estimator = field(
        default="grpo",
        metadata=doc(
            "advantage estimator: grpo, dr_grpo, rloo (group baselines), reinforce_pp, "
            "reinforce_pp_baseline (discounted returns, batch-whitened), gae (a learned "
            "critic); README's table gives each formula"
        ),
    )
    gamma: float = field(
        default=1.0,
        metadata=doc("discount per model token (reinforce_pp*, gae)", min=0, max=1),
    )
    lam: float = field(default=0.95, metadata=doc("GAE's lambda (gae)", min=0, max=1))
    ratio: Ratio = field(
        default="token",
        metadata=doc(
            "importance ratio the clip acts on: token (PPO) or sequence (GSPO: the "
            "geometric mean of the sequence's token ratios)"
        ),
    )
    # Suits the small embedded model; billion-parameter models want about 1e-6.
    lr: float = field(default=2e-4, metadata=doc("learning rate", exclusive_min=0))
    lr_schedule: ScheduleSection = field(
        default_factory=ScheduleSection,
        metadata=doc("the learning rate's warm-up and decay over the train steps"),
    )
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
    policy_loss: PolicyLoss = field(
        default="ppo",
        metadata=doc(
            "ppo (the clipped surrogate, on algorithm.ratio's ratio) or cispo (a REINFORCE "
            "term weighted by the clipped, detached token ratio)"
        ),
    )
    correction: CorrectionsSection = field(
        default_factory=CorrectionsSection,
        metadata=doc("off-policy and engine-mismatch corrections of the behaviour sampling"),
    )
    clip_ratio_c: float = field(
        default=0.0,
        metadata=doc(
            "dual clip: where the advantage is negative, a token's loss is at most "
            "-advantage * clip_ratio_c however large its ratio; 0 = off, else > 1",
            min=0,
        ),
    )
    entropy_coef: float = field(
        default=0.0,
        metadata=doc(
            "entropy bonus: the loss minus this times the mean token entropy of the "
            "sampling distribution (aggregated as loss_agg); 0 = off (the entropy is "
            "still measured)",
            min=0,
        ),
    )
    overlong_buffer: int = field(
        default=0,
        metadata=doc(
            "soft overlong punishment (DAPO): a response longer than model.max_new_tokens "
            "- overlong_buffer tokens loses overlong_penalty times its share of the buffer "
            "it used; fewer than model.max_new_tokens; 0 = off",
            min=0,
        ),
    )
    overlong_penalty: float = field(
        default=1.0,
        metadata=doc("the overlong punishment of a response that uses the whole buffer", min=0),
    )
    overlong_filter: bool = field(
        default=False,
        metadata=doc(
            "truncated responses (a length limit, not the model, ended them) give no loss; "
            "their group's advantages still count them"
        ),
    )
    proximal_logp: Literal["auto", "recompute", "trainer"] = field(
        default="auto",
        metadata=doc(
            "auto: logp reuses the generator's log-probs for a group generated wholly by the "
            "version it holds (same model code and weights: they agree to about 1e-7), and "
            "scores the rest; with backends.generate or backends.train other than torch it "
            "always scores; "
            "recompute: always score; "
            "trainer: no logp stage runs, the proximal policy is the trainer's weights as "
            "its step begins, read from the update's own forward pass (one update per step, "
            "no rejection, torch generating and training in one dtype)"
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
    mini_batches: int = field(
        default=1,
        metadata=doc(
            "optimizer steps per epoch over a train step's batch: the batch's groups are "
            "split into this many mini-batches (it must divide "
            "pipeline.train_batch_groups)",
            min=1,
        ),
    )
    epochs: int = field(
        default=1,
        metadata=doc(
            "passes over a train step's batch, each in mini_batches optimizer steps (the "
            "groups shuffled anew per step and epoch); still one version per train step",
            min=1,
        ),
    )
    temperature: float = field(default=1.0, metadata=doc("sampling temperature", exclusive_min=0))
    # Generators sample, and scorers and the trainer recompute log-probs, under the same
    # truncation (actors/policy/sampling.py), so behaviour and recomputed log-probs are of
    # one distribution.
    top_p: float = field(
        default=1.0,
        metadata=doc(
            "nucleus sampling: the fewest most likely tokens whose probability reaches "
            "this (after top_k); 1: the whole distribution",
            exclusive_min=0,
            max=1,
        ),
    )
    top_k: int = field(
        default=0,
        metadata=doc("sample among the k most likely tokens (ties kept); 0: every token", min=0),
    )
    min_p: float = field(
        default=0.0,
        metadata=doc(
            "sample among the tokens at least this times as likely as the most likely one "
            "(after the temperature, before top_k and top_p); 0: off",
            min=0,
        ),
    )
    # Matched on the decoded response by the generators (every engine alike): a response
    # ends with the token that completes a stop string, and that token is trained.
    stop: list[str] = field(
        default_factory=list,
        metadata=doc(
            "texts that end a response, kept in it with the token that completes them (as "
            "the end-of-sequence token is); one text or a list; empty: none",
            one_or_list=True,
        ),
    )
    filter_groups: FilterGroupsSection = field(
        default_factory=FilterGroupsSection,
        metadata=doc("dynamic sampling: groups without signal are filtered, not trained"),
    )
    router_replay: RouterReplaySection = field(
        default_factory=RouterReplaySection,
        metadata=doc("route each token through the experts the generator chose for it"),
    )

    def __post_init__(self) -> None:
        # At 1 only the most likely token would be left: greedy decoding, which a
        # sampled run's log-probs cannot describe.
        if not self.min_p < 1:
            raise ValueError(f"min_p: got {self.min_p!r}; allowed: a number in [0, 1) (0: off)")
        if not all(self.stop):
            raise ValueError(f"stop: got {self.stop!r}; allowed: non-empty texts")
        # Between 0 and 1 the bound would sit below the clipped loss it is meant to cap.
        if self.clip_ratio_c and not self.clip_ratio_c > 1:
            raise ValueError(
                f"clip_ratio_c: got {self.clip_ratio_c!r}; allowed: 0 (off) or a number > 1"
            )
        if self.policy_loss == "cispo" and self.ratio != "token":
            # CISPO's weight is each token's own clipped ratio; GSPO's sequence ratio has
            # no per-token ratio to clip.
            raise ValueError(
                f"policy_loss: got 'cispo' with algorithm.ratio={self.ratio!r}; allowed: "
                "ratio token with cispo"
            )
        if self.policy_loss == "cispo" and self.clip_ratio_c:
            # CISPO's weight never exceeds 1 + clip_high, so the dual clip could not bind.
            raise ValueError(
                f"policy_loss: got 'cispo' with algorithm.clip_ratio_c={self.clip_ratio_c!r}; "
                "allowed: clip_ratio_c 0 with cispo (its clipped weight already bounds the loss)"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class CriticSection:
    path: str = field(
        default="",
        metadata=doc(
            "model directory the critic starts from (its decoder; a value head is added), "
            "or a critic checkpoint; empty: model.path"
        ),
    )
    lr: float = field(default=1e-4, metadata=doc("the critic's learning rate", exclusive_min=0))
    lr_schedule: ScheduleSection = field(
        default_factory=ScheduleSection,
        metadata=doc("the critic's learning rate's warm-up and decay over its steps"),
    )
    clip: float = field(
        default=0.2,
        metadata=doc(
            "the value loss's clip: a value moves at most this far from the one the "
            "advantages were estimated with",
            exclusive_min=0,
        ),
    )
    layers: int = field(
        default=0,
        metadata=doc(
            "decoder layers the critic keeps: the lowest this many of critic.path's, under "
            "its value head (a smaller critic, cheaper to update and to score with); 0 = "
            "all of them",
            min=0,
        ),
    )
    frozen_layers: int = field(
        default=0,
        metadata=doc(
            "the critic's lowest decoder layers (and its embeddings) kept as loaded: no "
            "backward through them, no optimizer state; 0 = the whole critic learns",
            min=0,
        ),
    )
    values: Literal["step", "stage"] = field(
        default="step",
        metadata=doc(
            "where a group's values come from: step, the critic's step makes them in its "
            "update's forward pass (no values workers; fresh, at the version it trains "
            "from); stage, a values stage of their own beside logp, at the critic version "
            "their worker holds"
        ),
    )
    warmup_steps: int = field(
        default=0,
        metadata=doc(
            "steps in which only the critic learns: the policy's first steps take their "
            "batch without an update",
            min=0,
        ),
    )
