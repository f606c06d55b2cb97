"""What the group tests of every split share: one training step of a learner checked
against its checkpoint, and a scorer group's scores against one model's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncrl.actors.policy.checkpoint import load_model, state_for_saving
from asyncrl.actors.policy.sampling import PLAIN
from asyncrl.actors.training.learner import Group, Learner, StepStats
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


def score_in_turn(
    model: Any,
    leases: tuple[p.Lease | None, ...],
    pad_id: int,
    gang: Any,
    rank: int,
    load_version: Callable[[], None],
    results: Any,
) -> None:
    """A scorer rank's part: each lease scored by the group (the leader queues the
    scores), and at each None a new version loaded by ``load_version`` (a collective)."""
    from asyncrl.actors.training.scorer import score_items

    for lease in leases:
        if lease is None:
            load_version()
            continue
        scores = score_items(model, lease.items, pad_id, PLAIN, gang)
        if rank == 0:
            results.put([s.copy() for s in scores])


def assert_scores_like_one_model(
    shared: list[list[np.ndarray]],
    model_path: str,
    leases: tuple[p.Lease | None, ...],
    next_version: dict[str, torch.Tensor],
    tolerance: float,
) -> None:
    """The group's scores (``shared``, in lease order) against one torch model scoring the
    same leases, the same new version loaded at each None."""
    from asyncrl.actors.policy.checkpoint import load_state
    from asyncrl.actors.training.scorer import score_items

    model, codec = load_model(model_path)
    expected_all = []
    for lease in leases:
        if lease is None:
            load_state(model, next_version)
        else:
            expected_all.append(score_items(model, lease.items, codec.pad_id, PLAIN))
    # The last lease is the first again, under the new version: the version mattered.
    assert np.abs(expected_all[-1][0] - expected_all[0][0]).max() > 1e-3
    for got, expected in zip(shared, expected_all, strict=True):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert a.shape == b.shape
            assert np.abs(a - b).max() <= tolerance
