"""One TRL ``GRPOTrainer`` run of an asyncrl config, in a process of its own (for ``vs_trl``).

    python -m tests.bench._trl_grpo -c deploy/configs/default.yaml --steps 300 --out DIR
        [--snapshot-every 10] [section.key=value ...]

The config's model, task and hyperparameters become TRL's (:func:`grpo_config`; what has
no TRL counterpart is listed in ``vs_trl``'s docstring). Nothing is validated here: every
``--snapshot-every`` steps, and after the last, the weights are written to
``DIR/snapshots/step-NNNNNNN.safetensors`` under Hugging Face names, which asyncrl's model
loads as they are, for the bench to score afterwards. ``DIR/steps.jsonl`` gets one line
per optimizer step: ``step``, ``train_s`` (seconds from ``on_train_begin`` to that step's
``on_step_end``, less the time spent writing snapshots and these lines) and TRL's logged
``reward`` (the step's mean training reward).

Torch uses every core this process may run on: the bench gives each contender the whole
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["grpo_config", "main"]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def grpo_config(cfg: Any, steps: int, out: Path) -> Any:
    """TRL's ``GRPOConfig`` for asyncrl's ``cfg``: one optimizer step takes
    ``pipeline.train_batch_groups`` prompts x ``data.group_size`` completions, generated
    once and trained on in micro-batches of ``algorithm.micro_batch_groups`` prompts."""
    from trl import GRPOConfig

    a, groups = cfg.algorithm, cfg.pipeline.train_batch_groups
    if a.estimator != "grpo" or groups % a.micro_batch_groups:
        raise SystemExit(
            "the TRL run maps only algorithm.estimator=grpo, with pipeline.train_batch_groups "
            "a multiple of algorithm.micro_batch_groups"
        )
    return GRPOConfig(
        output_dir=str(out / "trainer"),
        seed=cfg.run.seed,
        data_seed=cfg.run.seed,
        max_steps=steps,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,  # GRPOConfig turns it on by default; asyncrl has none
        # The batch: prompts x completions per step, micro-batched as asyncrl's trainer does.
        num_generations=cfg.data.group_size,
        per_device_train_batch_size=a.micro_batch_groups * cfg.data.group_size,
        gradient_accumulation_steps=groups // a.micro_batch_groups,
        num_iterations=1,
        shuffle_dataset=False,  # prompts in index order, as asyncrl's dataloader offers them
        # Sampling.
        max_completion_length=cfg.model.max_new_tokens,
        temperature=a.temperature,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        # The loss.
        loss_type={"token": "dapo", "sequence": "grpo"}[a.loss_agg],
        scale_rewards="group",
        epsilon=a.clip_low,
        epsilon_high=a.clip_high,
        beta=a.kl_coef,
        max_grad_norm=a.max_grad_norm,
        # The optimizer: asyncrl's trainer uses torch's AdamW with these values.
        optim="adamw_torch",
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        # Nothing else on the way: no evaluation, no checkpoints, no reporting.
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--snapshot-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0: every core")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads or _cores())

    from datasets import Dataset
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from asyncrl.actors.policy.checkpoint import model_dir
    from asyncrl.actors.policy.tokenizer import TextCodec
    from asyncrl.actors.tasks import RewardFunction, TaskError, load_task
    from asyncrl.runtime.contract.config import load_config

    cfg = load_config(args.config, args.overrides)
    directory = model_dir(cfg.model.path)
    task = load_task(cfg.data.task)
    reward = RewardFunction.load(cfg.data.reward, task, cfg.data.task)
    codec = TextCodec.from_dir(directory)
    prompts = args.steps * cfg.pipeline.train_batch_groups
    samples = [task.sample("train", i) for i in range(prompts)]
    dataset = Dataset.from_dict(
        {"prompt": [s.prompt for s in samples], "index": list(range(prompts))}
    )

    def task_reward(completion_ids: list[list[int]], index: list[int], **_: Any) -> list[float]:
        """The task's reward of each completion, its text decoded as asyncrl decodes it."""
        rewards = []
        for ids, i in zip(completion_ids, index, strict=True):
            try:
                rewards.append(reward(samples[i], codec.decode(ids)))
            except TaskError:
                rewards.append(0.0)  # as asyncrl's validation counts a failed reward
        return rewards

    snapshots = args.out / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    steps_file = (args.out / "steps.jsonl").open("w")

    class Clock(TrainerCallback):
        """Training time per step, with snapshot-taking left out of it."""

        def __init__(self) -> None:
            self.began = 0.0
            self.excluded = 0.0
            self.rewards: dict[int, float] = {}

        def on_train_begin(self, args_, state, control, **kwargs):
            self.began = time.perf_counter()

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards[state.global_step] = float(logs["reward"])

        def on_step_end(self, args_, state, control, model=None, **kwargs):
            now = time.perf_counter()
            step = state.global_step
            if step % args.snapshot_every == 0 or step == args.steps:
                tied = model.config.tie_word_embeddings
                weights = {
                    name: tensor.detach().clone().contiguous()
                    for name, tensor in model.state_dict().items()
                    if not (tied and name == "lm_head.weight")
                }
                save_file(weights, str(snapshots / f"step-{step:07d}.safetensors"))
            line = {"step": step, "train_s": round(now - self.began - self.excluded, 4)}
            steps_file.write(json.dumps(line) + "\n")
            steps_file.flush()
            self.excluded += time.perf_counter() - now

    clock = Clock()
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=task_reward,
        args=grpo_config(cfg, args.steps, args.out),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    steps_file.close()
    # TRL logs a step's reward once the step is over: after its on_step_end line.
    (args.out / "rewards.json").write_text(json.dumps(clock.rewards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
