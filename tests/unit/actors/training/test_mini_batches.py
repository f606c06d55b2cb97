"""Several updates per train step: which groups each update takes, that one update of
the whole batch is exactly the step it always was, and that later updates take their
ratio against the batch's proximal policy (so the clip acts, as PPO's does)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model, model_dir, save_state
from asyncrl.actors.policy.sampling import Sampling
from asyncrl.actors.policy.scoring import response_logprobs
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.actors.training.mini_batches import mini_batch_groups
from asyncrl.actors.training.resume import Source, restore, resume_files, stage
from asyncrl.actors.training.scorer import pack_rollouts
from asyncrl.actors.training.staged_state import StagedState
from asyncrl.actors.training.step_advantages import step_advantages
from asyncrl.runtime.contract.config import config_from_dict
from tests.integration.test_train_group import _lease


def test_each_epoch_takes_every_group_once_in_equal_mini_batches() -> None:
    split = mini_batch_groups(8, 4, 3, seed=0, step=5)
    assert len(split) == 12 and all(len(chosen) == 2 for chosen in split)
    for epoch in range(3):
        taken = sorted(i for chosen in split[epoch * 4 : epoch * 4 + 4] for i in chosen)
        assert taken == list(range(8))
    assert all(chosen == sorted(chosen) for chosen in split)  # the lease's order within
    # shuffled anew per epoch...
    epochs = [split[e * 4 : e * 4 + 4] for e in range(3)]
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]


def test_the_split_is_a_function_of_the_seed_step_and_epoch_alone() -> None:
    assert mini_batch_groups(8, 2, 2, seed=0, step=3) == mini_batch_groups(8, 2, 2, seed=0, step=3)
    others = {str(mini_batch_groups(8, 2, 1, seed=s, step=t)) for s in (0, 1) for t in range(4)}
    assert len(others) > 1


def test_one_mini_batch_is_the_whole_batch_in_order_every_epoch() -> None:
    assert mini_batch_groups(5, 1, 1, seed=7, step=9) == [[0, 1, 2, 3, 4]]
    assert mini_batch_groups(3, 1, 2, seed=7, step=9) == [[0, 1, 2], [0, 1, 2]]


def test_a_batch_that_does_not_split_evenly_is_refused_naming_both_numbers() -> None:
    with pytest.raises(ValueError, match=r"batch of 6 groups .*mini_batches=4"):
        mini_batch_groups(6, 4, 1, seed=0, step=0)
    with pytest.raises(ValueError, match=r"mini_batches: got 3, .*train_batch_groups=8"):
        config_from_dict({"algorithm": {"mini_batches": 3}})


def _learner(**algorithm) -> Learner:
    torch.manual_seed(0)
    model, codec = load_model("embedded")
    algorithm = {"micro_batch_groups": 2, "lr": 1e-3, **algorithm}
    cfg = config_from_dict({"algorithm": algorithm, "pipeline": {"train_batch_groups": 4}})
    return Learner(model, cfg, codec.pad_id)


def _groups(seed: int = 3) -> list[Group]:
    return [Group.of(item) for item in _lease(seed=seed, groups=4, responses=4).items]


def _one_update_as_before(learner: Learner, groups: list[Group]) -> None:
    """The train step as it was with one optimizer step per batch, written out."""
    a = learner.cfg.algorithm
    rewards = [g.rewards for g in groups]
    advantages, _ = step_advantages([g.rollouts for g in groups], rewards, a, None)
    totals = (
        sum(g.rollouts.trained_tokens() for g in groups),
        sum(len(g.rollouts.lengths) for g in groups),
    )
    learner._accumulate(groups, advantages, totals)
    trained = [p for p in learner.model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(trained, a.max_grad_norm)
    learner.optimizer.step()
    learner.optimizer.zero_grad(set_to_none=True)


def test_one_mini_batch_and_one_epoch_update_bit_for_bit_as_before() -> None:
    ours, before = _learner(), _learner()
    for step in range(2):
        groups = _groups(seed=step)
        stats = ours.step(groups, step)
        _one_update_as_before(before, groups)
        assert stats.metrics["updates"] == 1 and stats.metrics["lr"] == 1e-3
        assert stats.metrics["grad_norm_max"] == stats.grad_norm
    for (name, mine), (_, theirs) in zip(
        ours.model.named_parameters(), before.model.named_parameters(), strict=True
    ):
        assert torch.equal(mine, theirs), name
    mine, theirs = ours.full_optimizer_state()["state"], before.full_optimizer_state()["state"]
    for name, entry in theirs.items():
        assert all(torch.equal(mine[name][k], v) for k, v in entry.items()), name


def test_each_update_is_an_optimizer_step_at_the_scheduled_rate() -> None:
    schedule = {"kind": "linear", "warmup_steps": 2}
    learner = _learner(mini_batches=2, epochs=2, lr_schedule=schedule)
    stats = learner.step(_groups(), steps_done=0)
    assert stats.metrics["updates"] == 4
    assert stats.metrics["lr"] == pytest.approx(5e-4)  # step 1 of a 2-step warm-up
    assert all(g["lr"] == pytest.approx(5e-4) for g in learner.optimizer.param_groups)
    (entry, *_) = learner.full_optimizer_state()["state"].values()
    assert int(entry["step"]) == 4  # AdamW stepped once per update
    assert stats.metrics["grad_norm_max"] >= stats.grad_norm > 0


def _scored_by_the_model(learner: Learner, groups: list[Group]) -> list[Group]:
    """``groups`` with proximal log-probs of the learner's own weights (as logp scores a
    batch of the trainer's current version)."""
    sampling = Sampling.of(learner.cfg.algorithm)
    out = []
    for g in groups:
        packed = pack_rollouts([g.rollouts], learner.pad_id)
        with torch.no_grad():
            logp = response_logprobs(learner.model, packed, sampling).numpy()
        width = g.proximal.logprobs.shape[1]
        logprobs = np.ascontiguousarray(logp[:, :width], dtype=np.float32)
        out.append(replace(g, proximal=replace(g.proximal, logprobs=logprobs)))
    return out


def test_later_updates_take_their_ratio_against_the_batch_proximal_policy() -> None:
    once = _learner(lr=1e-2)
    groups = _scored_by_the_model(once, _groups())
    first = once.step(groups, 0)
    # one update: the policy is the proximal one, its ratio 1 and nothing clipped
    assert first.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert first.metrics["clip_frac"] == 0.0
    twice = _learner(lr=1e-2, epochs=2)
    again = twice.step(_scored_by_the_model(twice, _groups()), 0)
    # the second epoch sees the policy the first moved: its ratios leave 1 and some clip
    assert abs(again.metrics["ratio_mean"] - 1.0) > 1e-3
    assert again.metrics["clip_frac"] > 0.0


def test_a_learner_taken_up_from_its_staged_state_goes_on_exactly_as_one_that_did_not_stop(
    tmp_path,
) -> None:
    """The rate and the split come from the step's number: a learner restored after step
    2 (as a trainer killed then restarts) makes steps 3 and 4 bit for bit as one that
    never stopped."""
    schedule = {"kind": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1}
    setting = {"mini_batches": 2, "epochs": 2, "lr_schedule": schedule}
    undisturbed, stopped = _learner(**setting), _learner(**setting)
    for step in range(2):
        undisturbed.step(_groups(step), step)
        stopped.step(_groups(step), step)
    store = StagedState(tmp_path / "staged", 0, {"ranks": 1})
    stage(stopped, store, 2)
    again = _learner(**setting)
    choice = restore(again, StagedState(tmp_path / "staged", 0, {"ranks": 1}), {}, 2)
    assert (choice.step, choice.source) == (2, Source.STAGED)
    for step in (2, 3):
        assert undisturbed.step(_groups(step), step) == again.step(_groups(step), step)
    for (name, mine), (_, theirs) in zip(
        again.model.named_parameters(), undisturbed.model.named_parameters(), strict=True
    ):
        assert torch.equal(mine, theirs), name


def test_a_learner_rolled_back_to_a_checkpoint_goes_on_exactly_as_one_that_did_not_stop(
    tmp_path,
) -> None:
    """A rollback takes up a checkpoint (weights, AdamW's state, no staged state); the
    steps after it are the undisturbed learner's, rate and mini-batches alike."""
    schedule = {"kind": "linear", "warmup_steps": 1, "min_lr_ratio": 0.2, "decay_steps": 4}
    setting = {"mini_batches": 2, "epochs": 2, "lr_schedule": schedule}
    undisturbed, stopped = _learner(**setting), _learner(**setting)
    for step in range(2):
        undisturbed.step(_groups(step), step)
        stopped.step(_groups(step), step)
    target = tmp_path / "step-2"
    extra = resume_files(2, stopped.full_optimizer_state(), {"step": 2})
    save_state(stopped.model.config, stopped.full_weights(), model_dir("embedded"), target, extra)
    again = _learner(**setting)
    empty = StagedState(tmp_path / "staged", 0, {"ranks": 1})
    assert restore(again, empty, {2: target}, 2).source is Source.CHECKPOINT
    for step in (2, 3):
        assert undisturbed.step(_groups(step), step) == again.step(_groups(step), step)
    for (name, mine), (_, theirs) in zip(
        again.model.named_parameters(), undisturbed.model.named_parameters(), strict=True
    ):
        assert torch.equal(mine, theirs), name
