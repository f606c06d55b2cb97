"""The corrections of the behaviour sampling and the CISPO loss against hand-computed values.

Every row below is written as its per-token ratios ``q/b`` (proximal over behaviour); the
expected weights and losses are derived in the comments with plain arithmetic.
"""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.rl import LossConfig, correct, correction_metrics, policy_loss
from asyncrl.runtime.contract.config.recipes import CorrectionSection

F64 = torch.float64
NONE = CorrectionSection(weight="none")


def rows_of(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(proximal, behaviour) log-probs whose per-token ratio q/b is ``ratios``."""
    proximal = torch.full((len(ratios), len(ratios[0])), -1.0, dtype=F64)
    behaviour = proximal - torch.tensor([[math.log(r) for r in row] for row in ratios], dtype=F64)
    return proximal, behaviour


def close(actual: torch.Tensor, expected: list) -> None:
    want = torch.tensor(expected, dtype=actual.dtype)
    assert actual.shape == want.shape, (actual, want)
    assert torch.allclose(actual, want, rtol=1e-6, atol=1e-9), (actual, want)


def corrected(
    ratios: list[list[float]],
    offpolicy: CorrectionSection = NONE,
    engine: CorrectionSection = NONE,
    engine_tokens: list[list[bool]] | None = None,
    mask: list[list[bool]] | None = None,
):
    proximal, behaviour = rows_of(ratios)
    eng = None if engine_tokens is None else torch.tensor(engine_tokens)
    real = torch.ones_like(proximal, dtype=torch.bool) if mask is None else torch.tensor(mask)
    return correct(proximal, behaviour, eng, real, offpolicy, engine)


# --- the split into an off-policy and an engine part ----------------------------------------


def test_the_default_split_multiplies_back_to_todays_truncated_weight() -> None:
    # ratios [2, 3, 0.5, 8]; token 0 was sampled by another version (off-policy), the rest
    # by logp's own (engine). Off-policy parts [2, 1, 1, 1], engine parts [1, 3, 0.5, 8];
    # both truncated at 5: [2, 1, 1, 1] * [1, 3, 0.5, 5] = [2, 3, 0.5, 5] = min(q/b, 5).
    c = corrected(
        [[2.0, 3.0, 0.5, 8.0]],
        CorrectionSection(),
        CorrectionSection(),
        engine_tokens=[[False, True, True, True]],
    )
    close(c.weight, [[2.0, 3.0, 0.5, 5.0]])
    assert c.keep.all()
    s = c.stats
    # before truncation, per trained token: off-policy 2+1+1+1 = 5, engine 1+3+0.5+8 = 12.5
    assert s.offpolicy_weight_sum.item() == pytest.approx(5.0)
    assert s.offpolicy_weight_max.item() == pytest.approx(2.0)
    assert s.offpolicy_truncated.item() == 0
    assert s.engine_weight_sum.item() == pytest.approx(12.5)
    assert s.engine_weight_max.item() == pytest.approx(8.0)
    assert s.engine_truncated.item() == 1


def test_each_part_weighs_only_the_tokens_its_versions_give_it() -> None:
    # ratios [2, 3, 0.5]: off-policy token 0, engine tokens 1 and 2. Weighting the engine
    # part alone gives [1, 3, 0.5]; the off-policy part alone [2, 1, 1].
    ratios, split = [[2.0, 3.0, 0.5]], [[False, True, True]]
    close(corrected(ratios, NONE, CorrectionSection(), split).weight, [[1.0, 3.0, 0.5]])
    close(corrected(ratios, CorrectionSection(), NONE, split).weight, [[2.0, 1.0, 1.0]])
    # no engine tokens given: every token's ratio is its off-policy part
    close(corrected(ratios, NONE, CorrectionSection()).weight, [[1.0, 1.0, 1.0]])


def test_a_cap_below_one_truncates_only_the_tokens_its_part_covers() -> None:
    # engine cap 0.8 on engine parts [-, 3, 0.5] -> [1, 0.8, 0.5]; token 0 is off-policy
    # and keeps engine weight 1.
    c = corrected([[2.0, 3.0, 0.5]], NONE, CorrectionSection(cap=0.8), [[False, True, True]])
    close(c.weight, [[1.0, 0.8, 0.5]])
    assert c.stats.engine_truncated.item() == 1


# --- sequence-level weights -----------------------------------------------------------------


def test_sequence_weight_is_the_product_of_the_rows_parts_truncated() -> None:
    # row 0: 2 * 3 * 0.5 = 3 (under cap 5) on every token; row 1: 4 * 2 * 1 = 8 -> 5,
    # all three tokens truncated.
    c = corrected([[2.0, 3.0, 0.5], [4.0, 2.0, 1.0]], CorrectionSection(weight="sequence"))
    close(c.weight, [[3.0, 3.0, 3.0], [5.0, 5.0, 5.0]])
    assert c.stats.offpolicy_truncated.item() == 3
    # the raw weight is the product on each token: 3 * 3 + 8 * 3 = 33, max 8
    assert c.stats.offpolicy_weight_sum.item() == pytest.approx(33.0)
    assert c.stats.offpolicy_weight_max.item() == pytest.approx(8.0)


def test_geometric_weight_is_the_mean_log_over_the_tokens_its_part_covers() -> None:
    # ratios [2, 4, 1]; engine tokens 1 and 2: engine geometric mean exp((ln 4 + ln 1) / 2)
    # = 2 on every token (not over 3 tokens: ln 2 is the off-policy part's). Off-policy
    # token-level [2, 1, 1]. Weight [2*2, 1*2, 1*2] = [4, 2, 2].
    c = corrected(
        [[2.0, 4.0, 1.0]],
        CorrectionSection(),
        CorrectionSection(weight="geometric"),
        [[False, True, True]],
    )
    close(c.weight, [[4.0, 2.0, 2.0]])


def test_geometric_weight_of_a_row_its_part_does_not_cover_is_one() -> None:
    c = corrected([[2.0, 4.0]], NONE, CorrectionSection(weight="geometric", cap=0.5))
    close(c.weight, [[1.0, 1.0]])  # no engine token: 1, even under a cap below 1
    assert c.stats.engine_truncated.item() == 0


def test_padding_is_out_of_the_product_and_the_mean() -> None:
    # row [2, 4, pad]: the pad's ratio 1000 must count nowhere. geometric = sqrt(8).
    c = corrected(
        [[2.0, 4.0, 1000.0]],
        CorrectionSection(weight="geometric"),
        mask=[[True, True, False]],
    )
    close(c.weight, [[math.sqrt(8.0), math.sqrt(8.0), 1.0]])
    assert c.stats.tokens.item() == 2
    assert not c.keep[0, 2]


# --- rejection ----------------------------------------------------------------------------


def test_icepop_masks_single_tokens_outside_the_interval() -> None:
    # engine parts [3, 1.5, 0.25, -]: with [0.5, 2], tokens 0 and 2 leave it; token 3 is
    # off-policy (ratio 10) and the engine mask does not see it.
    c = corrected(
        [[3.0, 1.5, 0.25, 10.0]],
        NONE,
        CorrectionSection(weight="none", reject="token", low=0.5, high=2.0),
        [[True, True, True, False]],
    )
    assert c.keep.tolist() == [[False, True, False, True]]
    s = c.stats
    assert s.engine_masked.item() == 2 and s.offpolicy_masked.item() == 0
    assert s.kept_tokens.item() == 2 and s.kept_sequences.item() == 1
    assert correction_metrics(s)["engine_masked_frac"] == pytest.approx(2 / 4)


def test_sequence_rejection_takes_out_the_whole_row() -> None:
    # row 0: product 2 * 1.5 = 3 > 2: rejected, both tokens out. row 1: 1.2 * 1 = 1.2 in
    # [0.5, 2]: kept. A token-level check would have kept row 0's second token (1.5).
    c = corrected(
        [[2.0, 1.5], [1.2, 1.0]],
        CorrectionSection(weight="none", reject="sequence", low=0.5, high=2.0),
    )
    assert c.keep.tolist() == [[False, False], [True, True]]
    s = c.stats
    assert s.offpolicy_rejected.item() == 1
    assert s.kept_tokens.item() == 2 and s.kept_sequences.item() == 1
    metrics = correction_metrics(s)
    assert metrics["offpolicy_rejected_frac"] == pytest.approx(1 / 2)
    assert metrics["offpolicy_masked_frac"] == 0.0


def test_geometric_rejection_judges_the_mean_not_the_product() -> None:
    # [1.5, 1.5, 1.5]: product 3.375 > 2 (sequence rejects it), geometric mean 1.5 (kept);
    # [0.6, 0.6, 0.6]: product 0.216 < 0.5 rejected, mean 0.6 kept; [3, 3, 0.1]: product
    # 0.9 kept, geometric 0.9^(1/3) = 0.965 kept too; [3, 3, 3]: both reject.
    ratios = [[1.5, 1.5, 1.5], [0.6, 0.6, 0.6], [3.0, 3.0, 0.1], [3.0, 3.0, 3.0]]
    by_product = corrected(ratios, CorrectionSection(weight="none", reject="sequence"))
    by_mean = corrected(ratios, CorrectionSection(weight="none", reject="geometric"))
    assert by_product.keep[:, 0].tolist() == [False, False, True, False]
    assert by_mean.keep[:, 0].tolist() == [True, True, True, False]


def test_a_row_with_every_token_masked_leaves_the_sequence_count() -> None:
    # row 0 [3, 3]: both masked by [0.5, 2], no token left: out of the kept sequences as a
    # rejected one would be, though no sequence rejection counted it.
    c = corrected([[3.0, 3.0], [1.0, 1.0]], CorrectionSection(weight="none", reject="token"))
    s = c.stats
    assert s.kept_sequences.item() == 1 and s.offpolicy_rejected.item() == 0
    assert s.offpolicy_masked.item() == 2


# --- in the loss: the weight, the masks and the normalisers ---------------------------------


def loss_and_grad(cfg: LossConfig, ratios, logp_over_proximal, advantages, **totals):
    proximal, behaviour = rows_of(ratios)
    logp = (proximal + torch.tensor(logp_over_proximal, dtype=F64).log()).requires_grad_()
    loss, stats = policy_loss(
        logp,
        proximal,
        behaviour,
        torch.tensor(advantages, dtype=F64),
        torch.ones_like(proximal, dtype=torch.bool),
        cfg,
        max_len=4,
        **totals,
    )
    loss.backward()
    return loss, logp.grad, stats


def test_masked_tokens_give_no_loss_and_no_gradient() -> None:
    # IcePop on the off-policy part, ratios [3, 1, 1.5]: token 0 leaves [0.5, 2]. The
    # others weigh min(q/b, 5) = [1, 1.5] (the token weight still applies). Current ratio
    # 1 everywhere, A = 1: loss = -(1 + 1.5) / 2 kept tokens.
    part = CorrectionSection(reject="token")
    cfg = LossConfig(offpolicy=part)
    loss, grad, stats = loss_and_grad(
        cfg, [[3.0, 1.0, 1.5]], [[1.0, 1.0, 1.0]], [1.0], total_tokens=2, total_sequences=1
    )
    assert loss.item() == pytest.approx(-2.5 / 2)
    close(grad, [[0.0, -1.0 / 2, -1.5 / 2]])
    assert stats.tokens.item() == 2  # the loss's statistics count the kept tokens only


def test_a_rejected_sequence_is_out_of_the_sequence_mean() -> None:
    # loss_agg sequence, sequence rejection: row 0 (product 3) out; row 1 ratios [1, 1]
    # with current ratios [1.1, 0.9] and A = 1: per-token -1.1 and -0.9, row mean -1, over
    # 1 kept sequence: -1 (with row 0 in, its weight 3 would have pushed it far lower).
    cfg = LossConfig(loss_agg="sequence", offpolicy=CorrectionSection(reject="sequence"))
    loss, grad, _ = loss_and_grad(
        cfg,
        [[3.0, 1.0], [1.0, 1.0]],
        [[1.2, 1.2], [1.1, 0.9]],
        [1.0, 1.0],
        total_tokens=2,
        total_sequences=1,
    )
    assert loss.item() == pytest.approx(-1.0)
    close(grad, [[0.0, 0.0], [-1.1 / 2, -0.9 / 2]])


def test_the_engine_split_reaches_the_loss() -> None:
    # ratios [4, 4]: token 0 off-policy, token 1 engine; engine cap 2, off-policy cap 5:
    # weights [4, 2]; ratio 1, A = 1: loss -(4 + 2) / 2.
    cfg = LossConfig(engine=CorrectionSection(cap=2.0))
    proximal, behaviour = rows_of([[4.0, 4.0]])
    logp = proximal.clone().requires_grad_()
    loss, _ = policy_loss(
        logp,
        proximal,
        behaviour,
        torch.tensor([1.0], dtype=F64),
        torch.ones(1, 2, dtype=torch.bool),
        cfg,
        total_tokens=2,
        total_sequences=1,
        max_len=2,
        engine_tokens=torch.tensor([[False, True]]),
    )
    assert loss.item() == pytest.approx(-3.0)


# --- CISPO --------------------------------------------------------------------------------


CISPO = LossConfig(policy_loss="cispo", clip_low=0.2, clip_high=0.28)


@pytest.mark.parametrize("advantage", [1.0, -2.0])
def test_cispo_weighs_each_tokens_log_prob_by_its_clipped_detached_ratio(
    advantage: float,
) -> None:
    # current ratios r = [1.5, 0.5, 1.0], clipped to [1 - 0.2, 1 + 0.28]: [1.28, 0.8, 1.0].
    # proximal = -1, so logp = [-1 + ln 1.5, -1 + ln 0.5, -1].
    # loss = -A * sum(clip(r) * logp) / 3; its gradient d/dlogp = -A * clip(r) / 3, the
    # clip's own dependence on logp left out (the weight is detached). PPO would give
    # token 0 (r above the clip, A > 0) no gradient at all.
    clipped = [1.28, 0.8, 1.0]
    logps = [-1.0 + math.log(1.5), -1.0 + math.log(0.5), -1.0]
    loss, grad, stats = loss_and_grad(
        CISPO, [[1.0, 1.0, 1.0]], [[1.5, 0.5, 1.0]], [advantage], total_tokens=3, total_sequences=1
    )
    expected = -advantage * sum(c * lp for c, lp in zip(clipped, logps, strict=True)) / 3
    assert loss.item() == pytest.approx(expected)
    close(grad, [[-advantage * c / 3 for c in clipped]])
    assert stats.clipped.item() == 2  # the clip changed tokens 0 and 1
    assert stats.dual_clipped.item() == 0


def test_cispo_takes_the_corrections_weight() -> None:
    # behaviour ratio 2 on token 0 (weight 2), 8 on token 1 (capped at 5); current ratio
    # 1 (clip leaves it); A = 1: gradient -[2, 5] / 2.
    _, grad, _ = loss_and_grad(
        CISPO, [[2.0, 8.0]], [[1.0, 1.0]], [1.0], total_tokens=2, total_sequences=1
    )
    close(grad, [[-1.0, -2.5]])


def test_cispo_refuses_the_sequence_ratio_and_the_dual_clip() -> None:
    with pytest.raises(ValueError, match="ratio"):
        LossConfig(policy_loss="cispo", ratio="sequence")
    with pytest.raises(ValueError, match="clip_ratio_c"):
        LossConfig(policy_loss="cispo", clip_ratio_c=3.0)


@pytest.mark.parametrize(
    ("part", "match"),
    [
        (CorrectionSection(cap=0.0), "offpolicy.cap"),
        (CorrectionSection(low=0.0), "offpolicy.low"),
        (CorrectionSection(high=0.5), "offpolicy.high"),
        (CorrectionSection(weight="product"), "offpolicy.weight"),  # type: ignore[arg-type]
        (CorrectionSection(reject="mask"), "offpolicy.reject"),  # type: ignore[arg-type]
    ],
)
def test_bad_corrections_name_the_field(part: CorrectionSection, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LossConfig(offpolicy=part)
