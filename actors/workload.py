"""What a run trains on, from its config: the task and its reward.

With ``data.train_files`` the prompts come from data files (:mod:`.tasks.datafiles`),
their chat messages rendered by the model directory's chat template; otherwise from the
``data.task`` plug-in. The dataloader, the generator (validation), the reward role and
the checks before a run all take them from here, so they agree.
"""

from __future__ import annotations

import json

from asyncrl.runtime.contract.config import RunConfig
from asyncrl.runtime.contract.rundir import RunDir

from .policy.chat_template import ChatTemplate
from .policy.directories import model_dir
from .policy.tokenizer import TextCodec
from .tasks import RewardFunction, Task, load_task
from .tasks.datafiles import DataFiles
from .tasks.rewards import JUDGE_PREFIX, MATH, load_reward
from .tasks.rows import Row

__all__ = [
    "load_workload",
    "prompt_token_limit",
    "reward_choice",
    "reward_for",
    "serves_api",
    "validation_reward_for",
    "workload_name",
]


def load_workload(cfg: RunConfig) -> Task:
    """The run's task: its data files, or the ``data.task`` plug-in."""
    data = cfg.data
    if not data.train_files:
        return load_task(data.task)
    directory = model_dir(cfg.model.path)
    template = ChatTemplate.from_dir(directory)
    codec = TextCodec.from_dir(directory)
    limit = prompt_token_limit(cfg)

    def prepare(row: Row) -> str:
        prompt = template.render(row.messages)
        tokens = len(codec.encode(prompt))
        if tokens > limit:
            raise ValueError(
                f"the prompt is {tokens} tokens; the generator takes {limit} "
                "(model.max_prompt_tokens, less max_new_tokens at the model's positions)"
            )
        return prompt

    return DataFiles.read(
        data.train_files,
        data.val_files,
        seed=cfg.run.seed,
        prepare=prepare,
        train_weights=data.train_weights,
    )


def workload_name(cfg: RunConfig) -> str:
    """How errors name the task: the plug-in's import path, or the data files' key."""
    return "data.train_files" if cfg.data.train_files else cfg.data.task


def reward_for(cfg: RunConfig, task: Task | None = None) -> RewardFunction:
    """The run's reward (``data.reward``; with data files the math verifier by default),
    guarded by ``data.reward_timeout_s``. ``task`` is loaded here only if the reward is
    the task's own (the reward role then reads no data files)."""
    choice = reward_choice(cfg)
    timeout_s = cfg.data.reward_timeout_s
    if choice.startswith(JUDGE_PREFIX):
        from .serving.judge import JudgeReward  # the openai client: only judges need it

        judge = JudgeReward(choice, RunDir.of(cfg).api_servers, timeout_s)
        return RewardFunction(judge, choice, timeout_s)
    if task is None and not choice:
        task = load_workload(cfg)
    return load_reward(choice, task, workload_name(cfg), timeout_s=timeout_s)


def validation_reward_for(cfg: RunConfig, task: Task) -> RewardFunction:
    """What validation scores with: the run's reward, but a judge's run its task's own
    (the ground truth; a judge is a training signal, and asks the generator that is
    validating)."""
    if reward_choice(cfg).startswith(JUDGE_PREFIX):
        return load_reward("", task, workload_name(cfg), timeout_s=cfg.data.reward_timeout_s)
    return reward_for(cfg, task)


def serves_api(cfg: RunConfig) -> bool:
    """Whether generators serve the OpenAI-compatible API: to harnesses, or to a judge."""
    return bool(cfg.data.harness) or reward_choice(cfg).startswith(JUDGE_PREFIX)


def prompt_token_limit(cfg: RunConfig) -> int:
    """The longest prompt the generator takes, as its decoder is sized."""
    config = json.loads((model_dir(cfg.model.path) / "config.json").read_text())
    positions = config.get("max_position_embeddings", cfg.model.max_prompt_tokens)
    return min(cfg.model.max_prompt_tokens, positions - cfg.model.max_new_tokens)


def reward_choice(cfg: RunConfig) -> str:
    """``data.reward``, or its default: the math verifier for data files, else the task's."""
    return cfg.data.reward or (MATH if cfg.data.train_files else "")
