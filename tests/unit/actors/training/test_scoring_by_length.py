"""A scorer's lease is scored in passes of rows of like length: the same log-probs as one
pass over every row, each row back in its place."""

from __future__ import annotations

import numpy as np
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.sampling import PLAIN
from asyncrl.actors.training import scorer
from asyncrl.actors.training.scorer import score_items
from tests.integration.test_train_group import _lease


def test_passes_by_length_score_as_one_pass_over_every_row(monkeypatch) -> None:
    model, codec = load_model("embedded")
    items = _lease(seed=5, groups=6, responses=4).items  # 24 rows, lengths 1..8
    torch.manual_seed(0)
    passes = []
    real_logprobs = scorer.response_logprobs
    monkeypatch.setattr(
        scorer, "response_logprobs", lambda *a: passes.append(1) or real_logprobs(*a)
    )
    by_length = score_items(model, items, codec.pad_id, PLAIN)
    assert len(passes) > 1, "the lease was scored in one pass: nothing was cut"
    monkeypatch.setattr(scorer, "SCORE_ROWS", 10_000)  # every row in one pass
    monkeypatch.setattr(scorer, "SCORE_SLACK", float("inf"))
    whole = score_items(model, items, codec.pad_id, PLAIN)
    assert len(by_length) == len(whole) == 6
    for got, want in zip(by_length, whole, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert any(np.abs(w).sum() > 0 for w in whole)


def test_a_leases_values_in_passes_of_like_length_are_each_groups_own() -> None:
    from asyncrl.actors.critic import load_value_model, response_values
    from asyncrl.actors.payloads import RolloutsOut

    model, codec = load_value_model("embedded")
    torch.manual_seed(0)
    torch.nn.init.normal_(model.score.weight)  # a head that says something (it starts at 0)
    rollouts = [RolloutsOut.of(item) for item in _lease(seed=7, groups=6, responses=4).items]
    packed = scorer.pack_rollouts(rollouts, codec.pad_id)
    with torch.inference_mode():
        together = scorer.per_group(
            scorer.by_like_length(packed, lambda part: response_values(model, part)), rollouts
        )
        alone = [
            response_values(model, scorer.pack_rollouts([r], codec.pad_id)).numpy()
            for r in rollouts
        ]
    assert len(scorer._passes_by_length(packed)) > 1
    for got, own, group in zip(together, alone, rollouts, strict=True):
        assert got.shape == group.response_ids.shape
        np.testing.assert_allclose(got[:, : own.shape[1]], own, atol=1e-5)
        assert not got[:, own.shape[1] :].any()
    assert any(np.abs(v).sum() > 0 for v in alone)
