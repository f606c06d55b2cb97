"""The values role follows the critic's versions from the critic's staged state, and a
critic publishes the versions its steps make due."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from asyncrl.actors.critic import load_value_model
from asyncrl.actors.critic.learner import CriticLearner
from asyncrl.actors.payloads import ValuesOut
from asyncrl.actors.roles.values import Values
from asyncrl.actors.training.group import Group
from asyncrl.actors.training.rank import staged_identity
from asyncrl.actors.training.resume import stage
from asyncrl.actors.training.staged_state import StagedState
from asyncrl.actors.worker.publishing import published_version, version_due
from asyncrl.runtime.config import config_from_dict
from tests.integration.test_train_group import _lease


def test_a_values_worker_loads_the_newest_staged_critic_step_not_past_the_version(tmp_path):
    cfg = config_from_dict({"algorithm": {"estimator": "gae"}})
    model, codec = load_value_model("embedded")
    critic = CriticLearner(model, cfg, codec.pad_id, lr=1e-3, clip=0.5)
    groups = [
        dataclasses.replace(
            g, values=ValuesOut(np.zeros(g.rollouts.response_ids.shape, np.float32), 0)
        )
        for g in (Group.of(item) for item in _lease(seed=3, groups=2, responses=4).items)
    ]
    store = StagedState(tmp_path, 0, staged_identity(cfg, 1))
    for step in (1, 2):
        critic.step(groups)
        stage(critic, store, step)
    values = Values()
    values.model, values.codec = load_value_model("embedded")
    values.stores, values.loaded = [StagedState(tmp_path, 0, staged_identity(cfg, 1))], 0
    assert values.on_version(0) == 0  # nothing newer published
    assert values.on_version(1) == 1  # step 1 is still staged: exactly it
    assert values.on_version(5) == 2  # the newest staged, not past what was published
    for mine, its in zip(values.model.parameters(), critic.model.parameters(), strict=True):
        assert torch.equal(mine, its)


def test_a_critic_publishes_its_step_count_when_ahead_of_its_published_version() -> None:
    summary = {"policy_version": 4, "steps_done": 4, "critic": {"steps_done": 3, "version": 2}}
    assert version_due(summary, critic=True) == 3
    assert published_version(summary, critic=True) == 2
    assert published_version(summary) == 4
    summary["critic"]["version"] = 3
    assert version_due(summary, critic=True) is None
    assert published_version({"policy_version": 1}, critic=True) is None  # no critic
