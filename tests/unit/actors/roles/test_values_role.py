"""The critic publishes its versions over the weight plane and the values role follows
them there (as logp follows the policy's), and a critic publishes the versions its steps
make due, again when the scheduler holds no weights for them."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.actors.actor import WorkerContext
from asyncrl.actors.payloads import ValuesOut
from asyncrl.actors.roles.critic import Critic
from asyncrl.actors.roles.values import Values
from asyncrl.actors.worker.publishing import published_version, version_due
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.runtime.contract.stages import Role
from asyncrl.runtime.scheduler.service.weight_routes import NoRoute, WeightRoutes
from asyncrl.transport import protocol as p
from tests.integration.test_train_group import _lease

LOAD_S = 30.0  # a version's fetch runs in the background: this long at most


def _config(tmp_path: Path, strategy: str) -> RunConfig:
    return config_from_dict(
        {
            "run": {"dir": str(tmp_path)},
            "algorithm": {"estimator": "gae"},
            "weights": {"strategy": strategy, "shm_dir": str(tmp_path / "slots")},
        }
    )


def _context(cfg: RunConfig, worker: str, routes: WeightRoutes) -> WorkerContext:
    def ask(version: int, address: bytes, failed: str) -> p.WeightsPlan | None:
        try:  # the scheduler's answer to WantWeights, from the same pure routes
            route = routes.route(worker, version, address, failed)
        except NoRoute:
            return None
        return p.WeightsPlan(route.version, route.manifest, route.source, route.source_address)

    return WorkerContext(worker, worker.split("-")[0], cfg, "ppo", 1.0, 60.0, 1 << 26, 0, 0, ask)


def _critic_lease(step: int) -> p.Lease:
    """Critic step ``step``'s batch with the values the values stage made for it (all 0)."""
    lease = _lease(seed=step, groups=2, responses=4)
    for item in lease.items:
        shape = item.data[Role.GENERATE.value]["response_ids"].shape
        item.data[Role.VALUES.value] = ValuesOut(np.zeros(shape, np.float32), 0).to_payload()
    return p.Lease(step, step, Role.CRITIC.value, 60.0, step - 1, lease.items)


def _load(values: Values, version: int) -> None:
    deadline = time.monotonic() + LOAD_S
    while values.on_version(version) != version:  # each turn one poll of the fetch
        assert time.monotonic() < deadline, f"critic version {version} not loaded"


@pytest.mark.parametrize("strategy", ["files", "shm", "ucx"])
def test_a_values_worker_loads_each_critic_version_over_the_weight_plane(
    tmp_path: Path, strategy: str
) -> None:
    cfg = _config(tmp_path, strategy)
    routes = WeightRoutes(fanout=2)
    critic, values = Critic(), Values()
    critic.on_start(_context(cfg, "critic-0", routes))
    values.on_start(_context(cfg, "values-0", routes))
    try:
        assert values.on_version(0) == 0  # nothing published: the critic it started from
        for step in (1, 2):
            critic.process(_critic_lease(step))
            announced = critic.on_publish(step)
            routes.announce(step, "critic-0", dict(announced.manifest), announced.address)
            _load(values, step)
            trained = dict(critic.rank.learner.model.named_parameters())
            loaded = dict(values.model.named_parameters())
            assert set(loaded) == set(trained) and any(n.startswith("score.") for n in loaded)
            for name, param in loaded.items():  # the whole value model, its head included
                assert torch.equal(param, trained[name]), name
        assert not torch.equal(trained["score.weight"], torch.zeros_like(trained["score.weight"]))
        reports = values.take_reports()
        assert [(r.name, r.version) for r in reports] == [("weights", 1), ("weights", 2)]
        assert all(r.data["bytes"] > 0 and r.data["source"] for r in reports), reports
    finally:
        values.on_stop()
        critic.on_stop()
        # Its host memory (/dev/shm): the critic's staged state and its weights' slots.
        run = RunDir.of(cfg)
        shutil.rmtree(run.critic_staged_state, ignore_errors=True)
        shutil.rmtree(run.weight_dirs(cfg.weights).shared, ignore_errors=True)


def test_the_critic_weights_have_directories_of_their_own(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "shm")
    run = RunDir.of(cfg)
    policy, critic = run.weight_dirs(cfg.weights), run.critic_weight_dirs(cfg.weights)
    # A publisher starting on a directory removes the slot files nobody holds: never the
    # trainer's directory, so the critic's start cannot take the policy's versions.
    assert critic.files != policy.files and critic.shared != policy.shared
    assert critic.files.parent == policy.files and critic.shared.parent == policy.shared


def test_a_critic_publishes_its_step_count_when_ahead_of_its_published_version() -> None:
    summary = {"policy_version": 4, "steps_done": 4, "critic": {"steps_done": 3, "version": 2}}
    assert version_due(summary, critic=True) == 3
    assert published_version(summary, critic=True) == 2
    assert published_version(summary) == 4
    assert published_version({"policy_version": 1}, critic=True) is None  # no critic


def test_a_critic_announces_its_version_again_when_no_weights_are_held_for_it() -> None:
    # A restarted scheduler (or one that forgot the critic) holds no announcement: its
    # values workers could never load the current critic version otherwise.
    critic = {"steps_done": 3, "version": 3, "weights": {"version": 3}}
    summary = {"policy_version": 4, "steps_done": 4, "critic": critic}
    assert version_due(summary, critic=True) is None
    critic["weights"] = {"version": None}
    assert version_due(summary, critic=True) == 3
    critic.update(steps_done=0, version=0)  # nothing trained: version 0 is everyone's
    assert version_due(summary, critic=True) is None
    # The policy's weights held say nothing of the critic's, and the other way round.
    summary["weights"] = {"version": 4}
    assert version_due(summary) is None
    summary["weights"] = {"version": None}
    assert version_due(summary) == 4
