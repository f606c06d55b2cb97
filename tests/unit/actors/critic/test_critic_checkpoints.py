"""The critic's own checkpoints: written every ``pipeline.checkpoint_every`` critic steps
in Hugging Face's names (a value model loads them), and taken up when its staged state is
gone (a lost host), the critic then asking the scheduler to roll the critic back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from asyncrl.actors.actor import WorkerContext
from asyncrl.actors.critic import load_value_model
from asyncrl.actors.roles.critic import Critic
from asyncrl.actors.training.resume import TRAINER_STATE
from asyncrl.runtime.contract.config import ConfigError, config_from_dict
from asyncrl.runtime.contract.rundir import RunDir
from tests.unit.actors.critic.test_critic_learner import _groups


def _context(cfg, steps_done: int, rewound: list[int]) -> WorkerContext:
    return WorkerContext(
        worker="critic-0",
        role="critic",
        config=cfg,
        run="critic-checkpoints",
        heartbeat_interval_s=1.0,
        lease_timeout_s=10.0,
        max_message_bytes=1 << 20,
        policy_version=0,
        steps_done=steps_done,
        rewind=rewound.append,
    )


def _params(critic: Critic) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in critic.rank.learner.model.named_parameters()}


def test_a_critic_without_its_staged_state_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "algorithm": {"estimator": "gae"},
            "run": {"dir": str(tmp_path / "run")},
            "pipeline": {"checkpoint_every": 2},
        }
    )
    run = RunDir.of(cfg)
    rewound: list[int] = []
    try:
        first = Critic()
        first.on_start(_context(cfg, 0, rewound))
        groups = _groups(0.1)
        at_two = {}
        for _ in range(3):
            first.rank.train(groups)
            if first._checkpoint_due():
                first.save_checkpoint()
                at_two = _params(first)
        assert run.critic_checkpoint_steps() == [2] and run.checkpoint_steps() == []
        # Hugging Face's names, loadable as the critic's own model directory.
        loaded, _ = load_value_model(str(run.critic_checkpoint(2)))
        for name, param in loaded.named_parameters():
            assert torch.equal(param, at_two[name]), name
        counters = json.loads((run.critic_checkpoint(2) / "counters.json").read_text())
        assert counters == {"critic_step": 2, "critic_version": 2}
        assert (run.critic_checkpoint(2) / TRAINER_STATE).is_file()
        first.rank.store.close()
        shutil.rmtree(run.critic_staged_state)  # its host's memory is gone

        again = Critic()
        again.on_start(_context(cfg, 3, rewound))  # the scheduler counts 3 critic steps
        assert again.step == 2 and rewound == [2]  # back to the checkpoint, and says so
        for name, param in _params(again).items():
            assert torch.equal(param, at_two[name]), name
        again.rank.train(groups)
        again.on_stop()  # a checkpoint of step 3, and the critic as it stopped
        assert run.critic_checkpoint_steps() == [2, 3]
        final, _ = load_value_model(str(run.final_critic))
        for name, param in final.named_parameters():
            assert torch.equal(param, _params(again)[name]), name
    finally:  # its host memory (/dev/shm): the staged state and the weights' slots
        shutil.rmtree(run.critic_staged_state, ignore_errors=True)
        shutil.rmtree(run.weight_dirs(cfg.weights).shared, ignore_errors=True)


def test_a_critic_with_its_staged_state_takes_it_up_and_rolls_nothing_back(tmp_path: Path) -> None:
    cfg = config_from_dict(
        {"algorithm": {"estimator": "gae"}, "run": {"dir": str(tmp_path / "run")}}
    )
    run = RunDir.of(cfg)
    rewound: list[int] = []
    try:
        first = Critic()
        first.on_start(_context(cfg, 0, rewound))
        first.rank.train(_groups(0.1))
        first.rank.store.close()
        again = Critic()
        again.on_start(_context(cfg, 1, rewound))
        assert again.step == 1 and rewound == []
        assert run.critic_checkpoint_steps() == []  # checkpoint_every is far off
    finally:  # its host memory (/dev/shm): the staged state and the weights' slots
        shutil.rmtree(run.critic_staged_state, ignore_errors=True)
        shutil.rmtree(run.weight_dirs(cfg.weights).shared, ignore_errors=True)


def test_only_the_newest_keep_checkpoints_are_kept(tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "algorithm": {"estimator": "gae"},
            "run": {"dir": str(tmp_path / "run"), "keep_checkpoints": 2},
            "pipeline": {"checkpoint_every": 1},
        }
    )
    run = RunDir.of(cfg)
    try:
        critic = Critic()
        critic.on_start(_context(cfg, 0, []))
        groups = _groups(0.1)
        kept = []
        for _ in range(4):
            critic.rank.train(groups)
            critic.save_checkpoint()
            kept.append(run.critic_checkpoint_steps())
        assert kept == [[1], [1, 2], [2, 3], [3, 4]]
        # Nothing else left beside them: each went whole (renamed away, then deleted).
        assert sorted(p.name for p in run.critic_checkpoints.iterdir()) == [
            "step-0000003", "step-0000004"
        ]  # fmt: skip
        critic.rank.store.close()
    finally:  # its host memory (/dev/shm): the staged state and the weights' slots
        shutil.rmtree(run.critic_staged_state, ignore_errors=True)
        shutil.rmtree(run.weight_dirs(cfg.weights).shared, ignore_errors=True)


def test_keep_checkpoints_of_one_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^run\.keep_checkpoints: got 1; allowed: 0"):
        config_from_dict({"run": {"keep_checkpoints": 1}})
    assert config_from_dict({}).run.keep_checkpoints == 3
