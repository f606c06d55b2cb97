"""The trainer against a scheduler whose count is not its own: a scheduler that lost the
record of the trainer's last step (its host died before journaling it) leases that step
again, and the trainer takes up its staged state for the scheduler's count in place and
trains it again to the same weights; a count ahead of it (another trainer trained the
steps between) still ends this process, which a restart resumes properly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from asyncrl.actors.actor import ActorBroken, WorkerContext
from asyncrl.actors.roles.train import Train
from asyncrl.runtime.contract.config import RunConfig, config_from_dict
from asyncrl.runtime.contract.rundir import RunDir
from asyncrl.transport import protocol as p
from tests.integration.test_train_group import _lease


def _config(tmp_path: Path) -> RunConfig:
    return config_from_dict(
        {
            "run": {"dir": str(tmp_path / "run"), "dump_rollouts": True},
            "weights": {"shm_dir": str(tmp_path / "slots")},
        }
    )


def _context(cfg: RunConfig) -> WorkerContext:
    return WorkerContext("train-0", "train", cfg, "behind", 1.0, 60.0, 1 << 26, 0, 0)


def _step_lease(version: int) -> p.Lease:
    """The batch of the step after ``version`` (the same batch whenever it is leased)."""
    lease = _lease(seed=version, groups=2, responses=4)
    return p.Lease(version + 1, version + 1, lease.role, 60.0, version, lease.items)


def _weights(train: Train) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in train.rank.learner.model.named_parameters()}


@pytest.fixture
def train(tmp_path: Path):
    cfg = _config(tmp_path)
    role = Train()
    role.on_start(_context(cfg))
    yield role
    role.rank.store.close()
    run = RunDir.of(cfg)  # its host memory (/dev/shm): the staged state and the slots
    shutil.rmtree(run.staged_state, ignore_errors=True)
    shutil.rmtree(run.weight_dirs(cfg.weights).shared, ignore_errors=True)


def test_a_step_leased_again_is_trained_again_from_the_scheduler_s_count(train: Train) -> None:
    torch.manual_seed(0)
    train.process(_step_lease(0))
    train.process(_step_lease(1))
    first_time, first_start = _weights(train), train.dump.started
    assert train.step == 2

    train.process(_step_lease(1))  # the scheduler came back counting 1 step

    assert train.step == 2 and train.resumed_at == 1
    for name, weight in _weights(train).items():
        assert torch.equal(weight, first_time[name]), name
    # The step's dump lines are a later trainer's: the reader keeps them over the lost ones.
    assert train.dump.started > first_start


def test_a_count_ahead_of_the_trainer_is_another_trainer_s_and_ends_it(train: Train) -> None:
    train.process(_step_lease(0))
    with pytest.raises(ActorBroken, match=r"leased a step from version 3.*at step 1"):
        train.process(_step_lease(3))
