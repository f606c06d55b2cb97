"""One training step of a learner in a group of ranks, checked against its checkpoint: what
the megatron group tests of every split share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from asyncrl.actors._learner import Group, Learner, StepStats
from asyncrl.actors.policy.checkpoint import load_model, state_for_saving
from asyncrl.transport import protocol as p


@dataclass
class GroupStep:
    stats: StepStats
    weights: dict[str, torch.Tensor]  # whole after the step, on the leader ({} elsewhere)
    optimizer: dict[str, Any]  # AdamW's state whole, by Hugging Face name
    same_weights: bool  # the base weights went back in and came out equal (leader)
    same_moments: bool  # so did the optimizer state (leader)


def step_and_reload(learner: Learner, rank: int, lease: p.Lease, model_path: str) -> GroupStep:
    """Check that the weights gathered over every split are exactly the checkpoint's at
    ``model_path``, train one step on ``lease``, then put a checkpoint back in (the base
    weights from rank 0, the optimizer state to every rank) and read both out again. A
    collective: every rank calls it."""
    # A copy: on CPU the leader's whole weights may be the parameters themselves.
    base = {name: t.clone() for name, t in learner.full_weights().items()}
    if rank == 0:
        loaded = state_for_saving(load_model(model_path)[0])
        assert sorted(base) == sorted(loaded)
        assert all(torch.equal(base[n], loaded[n]) for n in loaded)
    stats = learner.step([Group.of(item) for item in lease.items])
    weights = {name: t.clone() for name, t in learner.full_weights().items()}
    optimizer = learner.full_optimizer_state()
    learner.load_full_weights(base if rank == 0 else None)
    learner.load_optimizer_state(optimizer)
    reloaded, again = learner.full_weights(), learner.full_optimizer_state()
    if rank != 0:
        assert weights == {}  # only the leader holds the gathered weights
        return GroupStep(stats, weights, optimizer, True, True)
    same_weights = all(torch.equal(reloaded[n], base[n]) for n in base)
    same_moments = all(
        torch.equal(again["state"][n][k], optimizer["state"][n][k])
        for n in optimizer["state"]
        for k in optimizer["state"][n]
    )
    return GroupStep(stats, weights, optimizer, same_weights, same_moments)
