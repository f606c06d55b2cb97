"""The critic's step: towards GAE's returns, the same however its rows are cut."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from asyncrl.actors.critic import load_value_model
from asyncrl.actors.critic.learner import CriticLearner
from asyncrl.actors.payloads import ValuesOut
from asyncrl.actors.roles.critic import Critic
from asyncrl.actors.training.group import Group
from asyncrl.actors.training.resume import Source, restore, stage
from asyncrl.actors.training.staged_state import StagedState
from asyncrl.runtime.contract.config import config_from_dict
from tests.integration.test_train_group import _lease


def _groups(values: float | None = 0.0) -> list[Group]:
    groups = [Group.of(item) for item in _lease(seed=3, groups=4, responses=4).items]
    if values is None:
        return groups
    return [
        dataclasses.replace(
            g, values=ValuesOut(np.full(g.rollouts.response_ids.shape, values, np.float32), 0)
        )
        for g in groups
    ]


def _learner(per_micro: int, frozen_layers: int = 0) -> CriticLearner:
    torch.manual_seed(0)
    model, codec = load_value_model("embedded")
    cfg = config_from_dict(
        {
            "algorithm": {"micro_batch_groups": per_micro, "lam": 0.9},
            "critic": {"frozen_layers": frozen_layers},
        }
    )
    return CriticLearner(model, cfg, codec.pad_id, lr=1e-3, clip=0.5)


def test_the_values_move_towards_the_returns() -> None:
    learner, groups = _learner(2), _groups()
    first = learner.step(groups)
    for _ in range(4):
        last = learner.step(groups)  # the old values stay the batch's: the clip holds
    assert first.tokens == sum(g.rollouts.trained_tokens() for g in groups)
    assert last.value_loss < first.value_loss, (first, last)
    assert 0.0 <= last.value_clip_frac <= 1.0 and first.grad_norm > 0


def test_the_step_is_the_same_however_its_rows_are_cut() -> None:
    cut, whole = _learner(1), _learner(4)
    a, b = cut.step(_groups(0.3)), whole.step(_groups(0.3))
    assert abs(a.value_loss - b.value_loss) <= 1e-6 * b.value_loss
    assert abs(a.grad_norm - b.grad_norm) <= 1e-5 * b.grad_norm
    for p, q in zip(cut.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-7)


def _with_values(groups: list[Group], values: list[np.ndarray]) -> list[Group]:
    return [
        dataclasses.replace(g, values=ValuesOut(v, 0)) for g, v in zip(groups, values, strict=True)
    ]


@pytest.mark.parametrize("per_micro", [1, 4])
def test_without_values_the_step_makes_them_in_its_own_forward_pass(per_micro: int) -> None:
    # critic.values: step. The values it hands on are the critic's before the update (as
    # a values stage holding its version would make them), laid back whole from rows cut
    # over micro-batches, and the update is the one those values would have given.
    making, given = _learner(per_micro), _learner(per_micro)
    for learner in (making, given):  # the value head starts at 0: moved first
        learner.step(_groups(0.0))
    before = given.values_of(_groups(None))
    made = making.step(_groups(None)).made
    assert made is not None and len(made) == len(before)
    for ours, theirs in zip(made, before, strict=True):
        assert ours.shape == theirs.shape and np.abs(ours - theirs).max() < 1e-5
    assert any(np.abs(v).max() > 0 for v in made)
    stats = given.step(_with_values(_groups(None), before))
    assert stats.made is None  # brought by the groups, not made
    for p, q in zip(making.model.parameters(), given.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_with_several_updates_the_values_are_made_before_the_first() -> None:
    # The later updates of a step are clipped against the values its advantages use:
    # those are the critic's before any update, made in a pass of their own.
    cfg = {"algorithm": {"mini_batches": 2, "epochs": 2}, "pipeline": {"train_batch_groups": 4}}
    torch.manual_seed(0)
    model, codec = load_value_model("embedded")
    learner = CriticLearner(model, config_from_dict(cfg), codec.pad_id, lr=1e-3, clip=0.5)
    learner.step(_groups(0.0))  # the value head starts at 0: moved first
    before = learner.values_of(_groups(None))
    assert any(np.abs(v).max() > 0 for v in before)
    stats = learner.step(_groups(None))
    assert stats.updates == 4 and stats.made is not None
    for ours, theirs in zip(stats.made, before, strict=True):
        assert np.array_equal(ours, theirs)


def test_a_batch_of_groups_with_values_and_without_is_refused() -> None:
    groups = _groups(0.0)
    groups[1] = dataclasses.replace(groups[1], values=None)
    with pytest.raises(ValueError, match="all bring values or none"):
        _learner(2).step(groups)


def test_a_staged_critic_step_is_taken_up_bit_for_bit(tmp_path) -> None:
    """The trainer's staging and resume serve the critic: a critic killed after step 2
    comes back on its staged state and goes on exactly as if it had not died."""
    groups = _groups(0.1)
    first = _learner(2)
    first.step(groups)
    first.step(groups)
    store = StagedState(tmp_path / "staged", 0, {"ranks": 1})
    stage(first, store, 2)
    again = _learner(2)
    choice = restore(again, StagedState(tmp_path / "staged", 0, {"ranks": 1}), {}, 2)
    assert (choice.step, choice.source) == (2, Source.STAGED)
    for p, q in zip(first.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert first.step(groups) == again.step(groups)


def test_a_state_staged_with_more_layers_learning_is_refused_not_taken_in_part(tmp_path) -> None:
    # Staged with layer 1 learning, taken up by a critic that keeps it frozen: its staged
    # rows would be dropped and another critic resumed.
    first = _learner(2, frozen_layers=1)
    first.step(_groups(0.1))
    stage(first, StagedState(tmp_path / "staged", 0, {"ranks": 1}), 1)
    again = _learner(2, frozen_layers=2)
    with pytest.raises(
        ValueError, match=r"parameters this learner does not train \['param/model\.layers\.1\."
    ):
        restore(again, StagedState(tmp_path / "staged", 0, {"ranks": 1}), {}, 1)


def test_mini_batches_and_epochs_are_the_critics_updates_too_at_its_scheduled_rate() -> None:
    torch.manual_seed(0)
    model, codec = load_value_model("embedded")
    schedule = {"kind": "cosine", "min_lr_ratio": 0.5}
    cfg = config_from_dict(
        {
            "run": {"total_steps": 2},
            "algorithm": {"mini_batches": 2, "epochs": 3},
            "critic": {"lr_schedule": schedule},
            "pipeline": {"train_batch_groups": 4},
        }
    )
    learner = CriticLearner(model, cfg, codec.pad_id, lr=1e-3, clip=0.5)
    stats = learner.step(_groups(0.2), steps_done=0)
    assert stats.lr == 1e-3 and stats.updates == 6  # the decay starts at the whole rate
    assert stats.grad_norm_max >= stats.grad_norm > 0
    (entry, *_) = learner.optimizer.state.values()
    assert int(entry["step"]) == 6
    # step 2 of 2: cosine halfway, 0.5 + 0.5 * (1 + cos(pi / 2)) / 2 = 0.75 of the rate
    assert learner.step(_groups(0.2), steps_done=1).lr == pytest.approx(7.5e-4)


def _frozen(name: str) -> bool:
    return name.startswith(("model.embed_tokens.", "model.layers.0.", "model.layers.1."))


def test_frozen_layers_stay_as_loaded_and_only_the_layers_above_learn(tmp_path) -> None:
    # critic.frozen_layers=2 of the embedded model's 4: no optimizer state, no staged copy
    # and no change for the embeddings and layers 0-1; layers 2-3, the final norm and the
    # value head learn.
    learner = _learner(2, frozen_layers=2)
    loaded = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    for _ in range(2):
        stats = learner.step(_groups(0.3))
    assert stats.grad_norm > 0
    for name, param in learner.model.named_parameters():
        assert torch.equal(param, loaded[name]) == _frozen(name), name
    frozen = {n for n in loaded if _frozen(n)}
    assert frozen and learner.optimized == set(loaded) - frozen
    trained = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert trained == {id(p) for n, p in learner.model.named_parameters() if not _frozen(n)}
    staged = learner.local_state()
    assert not any(_frozen(key.split("/")[1]) for key in staged)
    assert "param/score.weight" in staged and "adam/score.weight/exp_avg" in staged


def test_freezing_every_layer_is_refused_by_the_learner_and_before_the_start() -> None:
    with pytest.raises(ValueError, match=r"critic\.frozen_layers=4: the critic has 4 decoder"):
        _learner(2, frozen_layers=4)
    cfg = config_from_dict({"algorithm": {"estimator": "gae"}, "critic": {"frozen_layers": 4}})
    assert Critic.check(cfg) == [
        "critic.frozen_layers=4: the critic has 4 decoder layers, so at most 3 can be "
        "frozen (one must learn)"
    ]
    assert Critic.check(config_from_dict({"critic": {"frozen_layers": 3}})) == []


def test_a_cut_critic_is_checked_against_its_directory_before_the_start() -> None:
    # critic.layers asks for at most the directory's 4 layers, and frozen_layers counts
    # within the layers it keeps.
    assert Critic.check(config_from_dict({"critic": {"layers": 5}})) == [
        "critic.layers=5: the critic's directory has 4 decoder layers; allowed: 1 to 4, "
        "or 0 for all of them"
    ]
    assert Critic.check(config_from_dict({"critic": {"layers": 2, "frozen_layers": 2}})) == [
        "critic.frozen_layers=2: the critic has 2 decoder layers, so at most 1 can be "
        "frozen (one must learn)"
    ]
    assert Critic.check(config_from_dict({"critic": {"layers": 2, "frozen_layers": 1}})) == []


def test_a_checkpoint_of_more_layers_than_the_critic_keeps_is_refused_on_resume() -> None:
    # A run resumed with a smaller critic.layers would load what fits and drop the rest:
    # another critic than the one saved.
    whole = {n: p.detach().clone() for n, p in load_value_model("embedded")[0].named_parameters()}
    model, codec = load_value_model("embedded", layers=2)
    cfg = config_from_dict({"critic": {"layers": 2}})
    learner = CriticLearner(model, cfg, codec.pad_id, lr=1e-3, clip=0.5)
    with pytest.raises(ValueError, match=r"weights this critic lacks, \['model\.layers\.2\."):
        learner.load_full_weights(whole)
    above = ("model.layers.2.", "model.layers.3.")
    fits = {n: t for n, t in whole.items() if not n.startswith(above)}
    learner.load_full_weights(fits)
    up = "model.layers.1.mlp.up_proj.weight"
    assert torch.equal(learner.model.model.layers[1].mlp.up_proj.weight, fits[up])
