"""The section that says what a run learns from: its task or data files, their mixture,
its reward, environment or harness, and how it validates (``data``; the fields'
metadata: fields.py).

Validation samples apart from training (``data.val_sampling`` against
``algorithm.temperature``, ``top_p``, ``top_k``, ``min_p``), so a run can train at
temperature 1 and validate greedily, or sample k responses per prompt for pass@k at a
temperature of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from .fields import doc

__all__ = ["DataSection", "ValSamplingSection"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValSamplingSection:
    temperature: float = field(
        default=0.0,
        metadata=doc(
            "validation's sampling temperature; 0 = greedy (the most likely token)", min=0
        ),
    )
    top_p: float = field(
        default=1.0,
        metadata=doc(
            "validation's nucleus sampling (as algorithm.top_p); 1: the whole distribution",
            exclusive_min=0,
            max=1,
        ),
    )
    top_k: int = field(
        default=0, metadata=doc("validation's top-k (as algorithm.top_k); 0: every token", min=0)
    )
    min_p: float = field(
        default=0.0,
        metadata=doc(
            "validation's min-p (as algorithm.min_p): tokens less likely than this times "
            "the most likely one are left out; 0: none",
            min=0,
        ),
    )

    def __post_init__(self) -> None:
        # At 1 only the most likely token would be left: greedy, said another way.
        if not self.min_p < 1:
            raise ValueError(f"min_p: got {self.min_p!r}; allowed: a number in [0, 1)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


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
    train_weights: dict[str, float] = field(
        default_factory=dict,
        metadata=doc(
            "a mixture: draw prompts in these proportions, keyed by a file as written in "
            "data.train_files or by a data_source of their rows; every row under exactly "
            "one key; empty: every row alike",
            exclusive_min=0,
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
    val_prompts: int = field(
        default=128,
        metadata=doc("prompts per validation set (each data source) in a validation pass", min=1),
    )
    val_samples: int = field(
        default=1,
        metadata=doc("responses sampled per validation prompt: the k of mean@k and pass@k", min=1),
    )
    val_sampling: ValSamplingSection = field(
        default_factory=ValSamplingSection,
        metadata=doc("how validation samples, apart from training (temperature 0: greedy)"),
    )
    val_pass_threshold: float = field(
        default=1.0,
        metadata=doc(
            "a validation response counts as correct (for pass@k) when its reward is at least this"
        ),
    )
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
    harness_sampling: Literal["request", "run"] = field(
        default="request",
        metadata=doc(
            "how the served API samples a harness's call: request (its own temperature, "
            "top_p, top_k and min_p, the run's where it names none; the behaviour log-probs "
            "recorded are those of what it sampled, which the importance weight corrects) "
            "or run (only the run's algorithm sampling; a call naming other is refused)"
        ),
    )

    def __post_init__(self) -> None:
        # Greedy decoding gives one response k times: pass@k would be pass@1, at k times
        # the cost.
        if self.val_samples > 1 and self.val_sampling.greedy:
            raise ValueError(
                f"val_samples: got {self.val_samples} with data.val_sampling.temperature=0 "
                "(greedy: k copies of one response); allowed: 1, or a temperature > 0"
            )
        # A harness's validation calls are decoded greedily by the generators' API.
        if self.harness and (self.val_samples > 1 or not self.val_sampling.greedy):
            raise ValueError(
                f"val_samples: got {self.val_samples} (val_sampling.temperature="
                f"{self.val_sampling.temperature:g}) with data.harness set; allowed: 1 and "
                "temperature 0 (a harness's validation calls are decoded greedily)"
            )
        if self.train_weights and not self.train_files:
            raise ValueError(
                f"train_weights: got {self.train_weights!r} with no data.train_files; "
                "allowed: empty, or weights of the training files or their data sources"
            )
        for name, weight in self.train_weights.items():
            if not 0 < weight < math.inf:  # NaN fails both
                raise ValueError(
                    f"train_weights.{name}: got {weight!r}; allowed: a finite number > 0"
                )
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
