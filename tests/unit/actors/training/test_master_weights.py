"""The trainer keeps float32 master weights and computes in ``model.dtype``.

At RL learning rates an AdamW update moves a weight by about the learning rate, far below
bfloat16's resolution (2**-8 of the weight): on bfloat16 weights a step would round away.
"""

from __future__ import annotations

import torch

from asyncrl.actors.startup.model_loading import load_policy
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.runtime.contract.config import config_from_dict
from tests.bench.train_memory import synthetic_lease


def _cfg(lr: float = 1e-6):
    return config_from_dict({"model": {"dtype": "bfloat16"}, "algorithm": {"lr": lr}})


def test_the_trainer_loads_float32_master_weights_and_the_scorers_model_dtype() -> None:
    cfg = _cfg()
    trainer, _ = load_policy(cfg, "train")
    scorer, _ = load_policy(cfg, "logp")
    assert {p.dtype for p in trainer.parameters()} == {torch.float32}
    assert {p.dtype for p in scorer.parameters()} == {torch.bfloat16}


def test_a_step_at_an_rl_learning_rate_moves_the_master_weights_and_publishes_bfloat16() -> None:
    cfg = _cfg(lr=1e-6)
    model, codec = load_policy(cfg, "train")
    learner = Learner(model, cfg, pad_id=codec.pad_id)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    lease = synthetic_lease(model.config.vocab_size, 8, 8, groups=2, responses=4)
    learner.step([Group.of(item) for item in lease.items])

    moved = rounded_away = 0
    for name, p in model.named_parameters():
        changed = p.detach() != before[name]
        moved += int(changed.sum())
        # Where bfloat16 weights would have stayed put: both values round to the same one.
        same_in_bf16 = p.detach().bfloat16() == before[name].bfloat16()
        rounded_away += int((changed & same_in_bf16).sum())
    assert moved > 0
    assert rounded_away > moved // 2  # most of the step lives below bfloat16's resolution

    published = learner.full_weights()
    assert {t.dtype for t in published.values()} == {torch.bfloat16}
    name = next(iter(published))
    assert torch.equal(published[name], dict(model.named_parameters())[name].detach().bfloat16())
