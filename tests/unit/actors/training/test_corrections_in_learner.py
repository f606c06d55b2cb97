"""The corrections inside a train step: a rejected sequence is out of the loss and of its
normalisers, so the step is the one the same learner makes without that sequence."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from asyncrl.actors.training.learner import Group
from tests.unit.actors.training.test_mini_batches import _groups, _learner

REJECT = {"weight": "token", "reject": "sequence", "low": 0.5, "high": 2.0}


def _with_ratios(groups: list[Group], rejected: set[tuple[int, int]]) -> list[Group]:
    """Proximal log-probs equal to the behaviour ones (ratio 1: every weight 1), but for the
    rows ``(group, row)`` in ``rejected``, whose first token's ratio is e^2 = 7.4 > 2."""
    out = []
    for gi, g in enumerate(groups):
        proximal = np.array(g.rollouts.logprobs, dtype=np.float32)
        for row in range(proximal.shape[0]):
            if (gi, row) in rejected:
                proximal[row, 0] += 2.0
        out.append(replace(g, proximal=replace(g.proximal, logprobs=proximal)))
    return out


def _without(groups: list[Group], rejected: set[tuple[int, int]]) -> list[Group]:
    kept = []
    for gi, g in enumerate(groups):
        rows = np.array([r for r in range(len(g.rollouts.lengths)) if (gi, r) not in rejected])
        kept.append(g.rows(rows))
    return kept


@pytest.mark.parametrize("loss_agg", ["token", "sequence"])
def test_a_rejected_sequence_trains_as_if_it_were_not_in_the_batch(loss_agg: str) -> None:
    rejected = {(0, 1), (2, 3)}
    groups = _with_ratios(_groups(), rejected)
    correction = {"offpolicy": REJECT, "engine": REJECT}
    rejecting = _learner(loss_agg=loss_agg, correction=correction)
    plain = _learner(loss_agg=loss_agg)  # the same initial weights (seeded)
    stats = rejecting.step(groups)
    expected = plain.step(_without(groups, rejected))
    # the loss's value shows the normalisers (AdamW's update would hide a constant factor)
    assert stats.metrics["loss"] == pytest.approx(expected.metrics["loss"], rel=1e-5)
    assert stats.metrics["loss"] != 0.0

    rows = sum(len(g.rollouts.lengths) for g in groups)
    rejected_frac = stats.metrics["offpolicy_rejected_frac"] + stats.metrics["engine_rejected_frac"]
    assert rejected_frac == pytest.approx(len(rejected) / rows)
    assert stats.metrics["offpolicy_masked_frac"] == stats.metrics["engine_masked_frac"] == 0.0
    worst = max(
        float((a - b).detach().abs().max())
        for a, b in zip(rejecting.model.parameters(), plain.model.parameters(), strict=True)
    )
    assert worst < 1e-6, worst
    moved = _learner(loss_agg=loss_agg)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(moved.model.parameters(), plain.model.parameters(), strict=True)
    )  # the step did change the weights: the comparison above is not vacuous
