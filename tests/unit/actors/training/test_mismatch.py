"""The gap between the generator's log-probs and the trainer side's under one version:
the computation on hand-built arrays, then the embedded model's own decoder against logp
scoring the same tokens, under the same weights and under weights changed in between."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asyncrl.actors.payloads import LogprobsOut, PayloadError, RewardsOut, RolloutsOut
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.sampling import PLAIN
from asyncrl.actors.roles.logp import Logp
from asyncrl.actors.training.group import Group
from asyncrl.actors.training.mismatch import (
    engine_tokens,
    mismatch_metrics,
    same_version_gaps,
    step_mismatch,
)
from asyncrl.runtime.contract.stages import Role
from asyncrl.transport import protocol as p
from tests.unit.actors.policy.test_proximal_reuse import generated_groups

# --- the computation --------------------------------------------------------------------


def hand_built(
    versions: list[list[int]], behaviour: list[list[float]], lengths: list[int]
) -> RolloutsOut:
    rows = [
        (list(range(5, 5 + n)), lp[:n], v[:n], False)
        for v, lp, n in zip(versions, behaviour, lengths, strict=True)
    ]
    return RolloutsOut.stack([3, 4], rows)


def group(
    rollouts: RolloutsOut, scored: np.ndarray, version: int, *, reused: bool = False
) -> Group:
    proximal = LogprobsOut(scored.astype(np.float32), version, reused)
    rewards = np.zeros(rollouts.lengths.shape[0], np.float32)
    return Group(0, rollouts, proximal, None, rewards)


def test_only_masked_tokens_of_the_scored_version_are_compared() -> None:
    behaviour = np.array([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]])
    scored = np.array([[-1.5, -2.0, -1.0], [-0.5, -0.75, 9.0]])
    versions = np.array([[3, 4, 4], [4, 4, 4]])
    mask = np.array([[1, 1, 1], [1, 1, 0]])  # the last token of row 2 is padding
    gaps = same_version_gaps(behaviour, versions, mask, scored, scored_version=4)
    # row 1: tokens 2 and 3 (token 1 was version 3); row 2: tokens 1 and 2
    assert gaps.tolist() == [0.0, 2.0, 0.0, -0.5]
    assert gaps.dtype == np.float64


def test_the_figures_are_the_abs_mean_max_and_k3_of_the_gaps() -> None:
    gaps = np.array([0.1, -0.2, 0.0, 0.4])
    m = mismatch_metrics(gaps)
    assert m["logprob_mismatch_tokens"] == 4
    assert m["logprob_mismatch_mean"] == pytest.approx((0.1 + 0.2 + 0.0 + 0.4) / 4)
    assert m["logprob_mismatch_max"] == pytest.approx(0.4)
    k3 = [math.exp(d) - 1 - d for d in gaps]
    assert m["logprob_mismatch_kl"] == pytest.approx(sum(k3) / 4, rel=1e-12)
    assert all(v >= 0 for v in k3)  # k3 is never negative, whichever side is larger
    # the log-perplexity gap: trainer's minus generator's, -mean(d) = -(0.3) / 4, signed
    assert m["logprob_mismatch_log_ppl"] == pytest.approx(-0.075)


def test_engine_tokens_are_the_trained_ones_of_logps_version_in_scored_groups() -> None:
    # row 0: versions [1, 1, 2] of length 3; row 1: [2, 2] of length 2 (3rd is padding)
    rollouts = hand_built([[1, 1, 2], [2, 2, 2]], [[-1.0, -1.0, -1.0]] * 2, [3, 2])
    scored = group(rollouts, np.full((2, 3), -1.0), version=2)
    assert engine_tokens(scored).tolist() == [[False, False, True], [True, True, False]]
    # logp reused the generator's log-probs: no token's ratio is the engines' gap
    reused = group(rollouts, rollouts.logprobs, version=2, reused=True)
    assert not engine_tokens(reused).any()


def test_k3_keeps_its_precision_for_gaps_of_float32_rounding() -> None:
    # exp(d) - 1 - d computed naively would be 0 or noise at d = 1e-7; it is d^2/2.
    m = mismatch_metrics(np.array([1e-7, -1e-7]))
    assert m["logprob_mismatch_kl"] == pytest.approx(0.5e-14, rel=1e-6)


def test_nothing_to_compare_leaves_the_figures_out_not_zero() -> None:
    assert mismatch_metrics(np.zeros(0)) == {"logprob_mismatch_tokens": 0}
    rollouts = hand_built([[2, 2]], [[-1.0, -1.0]], [2])
    older = group(rollouts, np.full((1, 2), -3.0), version=3)  # logp held a newer version
    assert step_mismatch([older]) == {"logprob_mismatch_tokens": 0}


def test_a_step_pools_its_groups_and_leaves_out_reused_ones() -> None:
    a = hand_built([[1, 1, 2], [2, 2, 2]], [[-1.0, -1.0, -1.0]] * 2, [3, 2])
    b = hand_built([[2, 2]], [[-0.5, -0.5]], [2])
    c = hand_built([[2, 2]], [[-0.5, -0.5]], [2])
    groups = [
        group(a, np.full((2, 3), -1.25), version=2),  # 3 tokens of version 2 (1 padding)
        group(b, np.full((1, 2), -0.5), version=2),  # 2 tokens, no gap
        group(c, c.logprobs, version=2, reused=True),  # taken from the generator: left out
    ]
    m = step_mismatch(groups)
    assert m["logprob_mismatch_tokens"] == 5
    assert m["logprob_mismatch_max"] == pytest.approx(0.25)
    assert m["logprob_mismatch_mean"] == pytest.approx(3 * 0.25 / 5)
    d = -0.25
    assert m["logprob_mismatch_kl"] == pytest.approx(3 * (math.exp(d) - 1 - d) / 5)


def test_arrays_of_different_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="must have one shape"):
        same_version_gaps(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 2)), np.zeros((2, 3)), 0)


def test_the_reused_mark_travels_with_logps_payload() -> None:
    item = p.Item(
        0, "k0", {Role.LOGP.value: LogprobsOut(np.zeros((1, 2), np.float32), 1, True).to_payload()}
    )
    assert LogprobsOut.of(item, Role.LOGP).reused is True
    older = {"logprobs": np.zeros((1, 2), np.float32), "version": 1}  # written before the mark
    assert LogprobsOut.of(p.Item(0, "k0", {Role.LOGP.value: older}), Role.LOGP).reused is False
    wrong = {**older, "reused": 1}
    with pytest.raises(PayloadError, match=r"logp\.reused is not a bool"):
        LogprobsOut.of(p.Item(0, "k0", {Role.LOGP.value: wrong}), Role.LOGP)


# --- the embedded model: its own decoder against logp's scoring --------------------------


def logp_role(*, reuses: bool, perturbed: bool = False) -> Logp:
    """A logp worker holding version 0 (the decoder's) without a bus: the embedded model,
    or that model with noise added to every weight (the version label unchanged)."""
    actor = Logp()
    actor.model, actor.codec = load_model("embedded")
    actor.sampling, actor.gang, actor.loaded, actor.reuses = PLAIN, None, 0, reuses
    if perturbed:  # what a bfloat16 engine or a bad weight load might do, and more
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in actor.model.parameters():
                noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
                parameter.add_(0.05 * parameter.abs().mean() * noise)
    return actor


def scored_groups(items: list[p.Item], actor: Logp) -> list[Group]:
    """``items`` through ``actor`` as a lease, then read as the trainer reads them."""
    lease = p.Lease(
        lease_id=1, fence=1, role=Role.LOGP.value, expires_in_s=60.0, version=0, items=tuple(items)
    )
    results = {r.gid: r.data for r in actor.process(lease).results}
    groups = []
    for item in items:
        n = RolloutsOut.of(item).lengths.shape[0]
        data = {
            **item.data,
            Role.LOGP.value: results[item.gid],
            Role.REWARD.value: RewardsOut(np.zeros(n, np.float32)).to_payload(),
        }
        groups.append(Group.of(p.Item(item.gid, item.key, data)))
    return groups


@pytest.fixture(scope="module")
def items() -> list[p.Item]:
    return generated_groups(n_groups=2, group_size=4)


def test_the_own_decoder_and_logp_agree_under_one_version(items: list[p.Item]) -> None:
    groups = scored_groups(items, logp_role(reuses=False))
    m = step_mismatch(groups)
    assert m["logprob_mismatch_tokens"] == sum(g.rollouts.trained_tokens() for g in groups) > 0
    assert m["logprob_mismatch_mean"] < 1e-6
    assert m["logprob_mismatch_max"] < 1e-5
    assert 0 <= m["logprob_mismatch_kl"] < 1e-10


def test_reused_log_probs_are_not_counted_as_a_measurement(items: list[p.Item]) -> None:
    groups = scored_groups(items, logp_role(reuses=True))
    assert all(g.proximal is not None and g.proximal.reused for g in groups)
    assert step_mismatch(groups) == {"logprob_mismatch_tokens": 0}


def test_weights_changed_under_the_same_version_label_show_as_a_wide_gap(
    items: list[p.Item],
) -> None:
    groups = scored_groups(items, logp_role(reuses=False, perturbed=True))
    m = step_mismatch(groups)
    assert m["logprob_mismatch_tokens"] > 0
    assert m["logprob_mismatch_mean"] > 1e-3
    assert m["logprob_mismatch_max"] > 1e-2
    assert m["logprob_mismatch_kl"] > 1e-6
