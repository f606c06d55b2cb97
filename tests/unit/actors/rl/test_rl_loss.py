"""The decoupled-PPO GRPO loss against hand-computed values.

Expected numbers are written out (or derived with plain ``math``), never obtained by
calling the loss a second time.
"""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.rl import (
    LossConfig,
    LossStats,
    correct,
    loss_metrics,
    merge_stats,
    policy_loss,
)
from asyncrl.runtime.contract.config.recipes import CorrectionSection

F64 = torch.float64
CFG = LossConfig(clip_low=0.2, clip_high=0.28, kl_coef=0.0)


def capped(cap: float, **kwargs: object) -> LossConfig:
    """A config whose corrections truncate both parts' weights at ``cap``."""
    part = CorrectionSection(cap=cap)
    return LossConfig(offpolicy=part, engine=part, **kwargs)  # type: ignore[arg-type]


def assert_close(actual: torch.Tensor | None, expected: torch.Tensor) -> None:
    """Shape-checked allclose (torch.testing's first call costs seconds of lazy imports)."""
    assert actual is not None and actual.shape == expected.shape, (actual, expected)
    assert torch.allclose(actual, expected.to(actual.dtype), rtol=1e-6, atol=1e-9), (
        actual,
        expected,
    )


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def leaf(values: torch.Tensor) -> torch.Tensor:
    return values.clone().requires_grad_(True)


def loss_of(
    logp: torch.Tensor,
    proximal: torch.Tensor,
    advantages: list[float],
    mask: torch.Tensor,
    cfg: LossConfig = CFG,
    *,
    behaviour: torch.Tensor | None = None,
    ref: torch.Tensor | None = None,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
    max_len: int = 8,
) -> tuple[torch.Tensor, LossStats]:
    """The loss with the micro-batch as the whole step unless totals are given."""
    return policy_loss(
        logp,
        proximal,
        proximal if behaviour is None else behaviour,
        torch.tensor(advantages, dtype=F64),
        mask,
        cfg,
        ref_logp=ref,
        total_tokens=float(mask.sum()) if total_tokens is None else total_tokens,
        total_sequences=mask.shape[0] if total_sequences is None else total_sequences,
        max_len=max_len,
    )


# --- the clipped surrogate on a 2x3 example ------------------------------------------------
# clip range [0.8, 1.28]. Row 0 has A = +1, row 1 has A = -2.
PROXIMAL = t([[-1.0, -2.0, -0.5], [-1.5, -0.7, -3.0]])
RATIOS = [[1.1, 1.5, 0.5], [0.9, 0.5, 1.5]]
ADV = [1.0, -2.0]
# per token: -min(r*A, clip(r)*A)
#   (0,0) r=1.1 inside:             -1.1
#   (0,1) r=1.5 > 1.28, A>0:        -min(1.5, 1.28)  = -1.28  (clipped)
#   (0,2) r=0.5 < 0.8,  A>0:        -min(0.5, 0.8)   = -0.5   (unclipped: no floor for A>0)
#   (1,0) r=0.9 inside:             -(0.9 * -2)      =  1.8
#   (1,1) r=0.5 < 0.8,  A<0:        -min(-1.0, -1.6) =  1.6   (clipped)
#   (1,2) r=1.5 > 1.28, A<0:        -min(-3.0, -2.56) = 3.0   (unclipped: no cap for A<0)
PER_TOKEN = [[-1.1, -1.28, -0.5], [1.8, 1.6, 3.0]]
# d(loss_t)/d(logp_t) = -A * r on the unclipped side, 0 on the clipped side
PER_TOKEN_GRAD = [[-1.1, 0.0, -0.5], [1.8, 0.0, 3.0]]


def logp_for(proximal: torch.Tensor, ratios: list[list[float]]) -> torch.Tensor:
    return leaf(proximal + torch.tensor(ratios, dtype=F64).log())


def test_each_token_loss_inside_and_outside_the_clip_range() -> None:
    for i in range(2):
        for j in range(3):
            mask = torch.zeros(2, 3, dtype=torch.bool)
            mask[i, j] = True
            loss, stats = loss_of(logp_for(PROXIMAL, RATIOS), PROXIMAL, ADV, mask)
            assert loss.item() == pytest.approx(PER_TOKEN[i][j]), (i, j)
            assert stats.clipped.item() == (1.0 if j == 1 else 0.0), (i, j)


def test_gradient_is_zero_exactly_where_the_clipped_branch_wins() -> None:
    logp = logp_for(PROXIMAL, RATIOS)
    loss, stats = loss_of(logp, PROXIMAL, ADV, torch.ones(2, 3))
    assert loss.item() == pytest.approx((-1.1 - 1.28 - 0.5 + 1.8 + 1.6 + 3.0) / 6)
    loss.backward()
    assert_close(logp.grad, t(PER_TOKEN_GRAD) / 6)
    assert logp.grad[0, 1].item() == 0.0 and logp.grad[1, 1].item() == 0.0
    assert stats.tokens.item() == 6.0
    assert stats.clipped.item() == 2.0
    assert stats.ratio_sum.item() == pytest.approx(1.1 + 1.5 + 0.5 + 0.9 + 0.5 + 1.5)


def test_a_ratio_on_the_clip_bound_is_not_counted_as_clipped() -> None:
    # r = 1.28 exactly: both branches are equal, so the clipped one does not "differ"
    proximal = t([[-1.0]])
    logp = leaf(proximal + math.log(1.28))
    loss, stats = loss_of(logp, proximal, [1.0], torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.28)
    assert stats.clipped.item() == 0.0


# --- the behaviour importance weight -------------------------------------------------------


def test_importance_weight_is_truncated_at_the_cap_and_carries_no_gradient() -> None:
    # w = exp(proximal - behaviour) = [3, 0.5, 1]; cap 2 truncates the first to 2
    raw_w = [3.0, 0.5, 1.0]
    proximal = leaf(t([[-1.0, -1.0, -1.0]]))
    behaviour = leaf(proximal.detach() - t([[math.log(w) for w in raw_w]]))
    logp = leaf(proximal.detach())  # ratio 1
    cfg = capped(2.0, clip_low=0.2, clip_high=0.28)
    loss, stats = loss_of(logp, proximal, [1.0], torch.ones(1, 3), cfg, behaviour=behaviour)
    assert loss.item() == pytest.approx((-2.0 - 0.5 - 1.0) / 3)
    loss.backward()
    assert_close(logp.grad, t([[-2.0, -0.5, -1.0]]) / 3)
    assert proximal.grad is None and behaviour.grad is None
    part = CorrectionSection(cap=2.0)
    corrected = correct(proximal, behaviour, None, torch.ones(1, 3), part, part).stats
    assert corrected.offpolicy_weight_sum.item() == pytest.approx(4.5)  # before truncation
    assert corrected.offpolicy_weight_max.item() == pytest.approx(3.0)
    assert corrected.offpolicy_truncated.item() == 1.0
    assert stats.behaviour_proximal_abs_diff_sum.item() == pytest.approx(math.log(3) + math.log(2))


def test_weight_and_clip_compose() -> None:
    # w = 2 on a token whose ratio 1.5 is clipped to 1.28 with A = 1: -2 * 1.28
    proximal = t([[-1.0]])
    behaviour = proximal - math.log(2.0)
    logp = leaf(proximal + math.log(1.5))
    loss, _ = loss_of(logp, proximal, [1.0], torch.ones(1, 1), behaviour=behaviour)
    assert loss.item() == pytest.approx(-2.56)


# --- KL to the reference -------------------------------------------------------------------
KL_LOGP = [[-1.0, -2.0]]
KL_REF = [[-1.5, -1.0]]
# d = ref - logp = [-0.5, 1.0]
K1 = [0.5, -1.0]  # logp - ref
K3 = [math.exp(-0.5) + 0.5 - 1.0, math.exp(1.0) - 1.0 - 1.0]  # exp(d) - d - 1
# d(k1)/d(logp) = 1; d(k3)/d(logp) = 1 - exp(d)
K1_GRAD = [1.0, 1.0]
K3_GRAD = [1.0 - math.exp(-0.5), 1.0 - math.exp(1.0)]


@pytest.mark.parametrize(
    ("estimator", "kl", "grad"), [("k1", K1, K1_GRAD), ("k3", K3, K3_GRAD)], ids=["k1", "k3"]
)
def test_kl_penalty_values_and_gradients(
    estimator: str, kl: list[float], grad: list[float]
) -> None:
    logp = leaf(t(KL_LOGP))
    cfg = LossConfig(kl_coef=0.1, kl_estimator=estimator)  # type: ignore[arg-type]
    # A = 0 and ratio 1: the policy term vanishes, only 0.1 * kl is left
    loss, stats = loss_of(logp, t(KL_LOGP), [0.0], torch.ones(1, 2), cfg, ref=t(KL_REF))
    assert loss.item() == pytest.approx(0.1 * sum(kl) / 2)
    assert stats.kl_sum is not None and stats.kl_sum.item() == pytest.approx(sum(kl))
    loss.backward()
    assert_close(logp.grad, t([[0.1 * g / 2 for g in grad]]))


def test_kl_is_measured_but_not_added_when_its_coefficient_is_zero() -> None:
    loss, stats = loss_of(t(KL_LOGP), t(KL_LOGP), [0.0], torch.ones(1, 2), ref=t(KL_REF))
    assert loss.item() == 0.0
    assert stats.kl_sum is not None and stats.kl_sum.item() == pytest.approx(sum(K3))


# --- aggregation ---------------------------------------------------------------------------
# w = 1, A = +1, ratios inside the clip range, so loss_t = -r. Row 1 has one real token.
AGG_PROXIMAL = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
AGG_RATIOS = [[1.0, 1.1, 0.9], [1.2, 1.0, 1.0]]
AGG_MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.float32)


@pytest.mark.parametrize(
    ("loss_agg", "estimator", "expected"),
    [
        ("token", "grpo", -(1.0 + 1.1 + 0.9 + 1.2) / 4),  # every token weighs 1/4
        ("sequence", "grpo", (-(1.0 + 1.1 + 0.9) / 3 - 1.2) / 2),  # mean per row, then rows
        ("token", "dr_grpo", -(1.0 + 1.1 + 0.9 + 1.2) / (2 * 5)),  # constant 2 seqs * 5
        ("sequence", "dr_grpo", -(1.0 + 1.1 + 0.9 + 1.2) / (2 * 5)),  # same: agg is ignored
    ],
)
def test_aggregation(loss_agg: str, estimator: str, expected: float) -> None:
    cfg = LossConfig(loss_agg=loss_agg, estimator=estimator)  # type: ignore[arg-type]
    logp = logp_for(AGG_PROXIMAL, AGG_RATIOS)
    loss, _ = loss_of(logp, AGG_PROXIMAL, [1.0, 1.0], AGG_MASK, cfg, max_len=5)
    assert loss.item() == pytest.approx(expected)


def test_an_empty_row_adds_nothing_to_the_sequence_mean() -> None:
    cfg = LossConfig(loss_agg="sequence")
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    logp = logp_for(AGG_PROXIMAL, AGG_RATIOS)
    loss, _ = loss_of(logp, AGG_PROXIMAL, [1.0, 1.0], mask, cfg)
    assert loss.item() == pytest.approx(-(1.0 + 1.1 + 0.9) / 3 / 2)


def test_padding_holding_garbage_changes_nothing() -> None:
    cfg = LossConfig(kl_coef=0.1)
    clean = logp_for(AGG_PROXIMAL, AGG_RATIOS)
    dirty = leaf(clean.detach())
    dirty.data[1, 1:] = math.inf
    behaviour, ref = AGG_PROXIMAL.clone(), AGG_PROXIMAL - 0.1
    dirty_behaviour, dirty_ref = behaviour.clone(), ref.clone()
    dirty_behaviour[1, 1:] = math.nan
    dirty_ref[1, 1:] = -math.inf
    args = (AGG_PROXIMAL, [1.0, -1.0], AGG_MASK, cfg)
    want, _ = loss_of(clean, *args, behaviour=behaviour, ref=ref)
    got, stats = loss_of(dirty, *args, behaviour=dirty_behaviour, ref=dirty_ref)
    assert got.item() == pytest.approx(want.item())
    want.backward()
    got.backward()
    assert_close(dirty.grad, clean.grad)
    assert dirty.grad[1, 1:].eq(0).all()
    assert all(math.isfinite(v) for v in loss_metrics(stats).values())


# --- micro-batching ------------------------------------------------------------------------


def _random_step() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    b, n = 4, 6
    proximal = -torch.rand(b, n, generator=g, dtype=F64) * 3
    lengths = torch.tensor([6, 2, 0, 4])
    return {
        "proximal": proximal,
        "logp": proximal + 0.3 * torch.randn(b, n, generator=g, dtype=F64),
        "behaviour": proximal + 0.5 * torch.randn(b, n, generator=g, dtype=F64),
        "ref": proximal + 0.2 * torch.randn(b, n, generator=g, dtype=F64),
        "advantages": torch.randn(b, generator=g, dtype=F64),
        "mask": torch.arange(n)[None, :] < lengths[:, None],
    }


@pytest.mark.parametrize(
    ("loss_agg", "estimator"), [("token", "grpo"), ("sequence", "grpo"), ("token", "dr_grpo")]
)
def test_two_micro_batches_sum_to_the_whole_step(loss_agg: str, estimator: str) -> None:
    cfg = capped(
        1.5,
        kl_coef=0.05,
        loss_agg=loss_agg,  # type: ignore[arg-type]
        estimator=estimator,  # type: ignore[arg-type]
    )
    step = _random_step()
    totals = {"total_tokens": 12.0, "total_sequences": 4, "max_len": 6}  # 6 + 2 + 0 + 4 tokens

    def run(logp: torch.Tensor, rows: slice) -> tuple[torch.Tensor, LossStats]:
        return policy_loss(
            logp[rows],
            step["proximal"][rows],
            step["behaviour"][rows],
            step["advantages"][rows],
            step["mask"][rows],
            cfg,
            ref_logp=step["ref"][rows],
            **totals,  # type: ignore[arg-type]
        )

    whole_logp, split_logp = leaf(step["logp"]), leaf(step["logp"])
    whole, whole_stats = run(whole_logp, slice(None))
    whole.backward()
    first, first_stats = run(split_logp, slice(0, 2))
    first.backward()  # gradients accumulate into split_logp.grad, as across micro-batches
    second, second_stats = run(split_logp, slice(2, 4))
    second.backward()

    assert_close(first + second, whole)
    assert_close(split_logp.grad, whole_logp.grad)
    assert whole_logp.grad.abs().sum() > 0
    assert loss_metrics([first_stats, second_stats]) == pytest.approx(loss_metrics(whole_stats))


# --- stats and metrics ---------------------------------------------------------------------


def _stats(tokens: float, clipped: float, w_max: float, kl: float | None) -> LossStats:
    one = torch.tensor
    return LossStats(
        tokens=one(tokens),
        clipped=one(clipped),
        ratio_sum=one(tokens),
        behaviour_proximal_abs_diff_sum=one(tokens * 0.1),
        dual_clipped=one(clipped / 2),
        kl_sum=None if kl is None else one(kl),
    )


def test_metrics_merge_micro_batches_as_token_means() -> None:
    metrics = loss_metrics([_stats(6.0, 2.0, 3.0, 0.6), _stats(2.0, 0.0, 7.0, 0.2)])
    assert metrics == pytest.approx(
        {
            "clip_frac": 2.0 / 8,
            "dual_clip_frac": 1.0 / 8,
            "ratio_mean": 1.0,
            "behaviour_proximal_abs_diff": 0.1,
            "kl_ref": 0.8 / 8,
        }
    )


def test_metrics_from_the_2x3_example() -> None:
    _, stats = loss_of(logp_for(PROXIMAL, RATIOS), PROXIMAL, ADV, torch.ones(2, 3))
    metrics = loss_metrics(stats)
    assert "kl_ref" not in metrics
    assert metrics["clip_frac"] == pytest.approx(2 / 6)
    assert metrics["ratio_mean"] == pytest.approx(6.0 / 6)


def test_merge_rejects_empty_and_mixed_kl() -> None:
    with pytest.raises(ValueError, match="at least one"):
        merge_stats([])
    with pytest.raises(ValueError, match="kl_sum"):
        merge_stats([_stats(1.0, 0.0, 1.0, 0.1), _stats(1.0, 0.0, 1.0, None)])


# --- input validation ----------------------------------------------------------------------


def _good() -> dict[str, object]:
    x = torch.zeros(2, 3)
    return {
        "logp": x,
        "proximal_logp": x,
        "behaviour_logp": x,
        "advantages": torch.zeros(2),
        "mask": torch.ones(2, 3),
        "cfg": CFG,
        "ref_logp": None,
        "total_tokens": 6,
        "total_sequences": 2,
        "max_len": 3,
    }


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("logp", torch.zeros(6)),
        ("logp", torch.zeros(2, 3, dtype=torch.long)),
        ("logp", torch.zeros(0, 3)),
        ("proximal_logp", torch.zeros(2, 4)),
        ("behaviour_logp", torch.zeros(3, 3)),
        ("mask", torch.ones(2, 2)),
        ("ref_logp", torch.zeros(2, 1)),
        ("advantages", torch.zeros(2, 1)),
        ("advantages", torch.zeros(3)),
        ("total_tokens", 0),
        ("total_tokens", -1.0),
        ("total_tokens", math.nan),
        ("total_sequences", 0),
        ("max_len", 0),
        ("cfg", {"clip_low": 0.2}),
    ],
)
def test_bad_input_names_the_argument(name: str, bad: object) -> None:
    kwargs = _good() | {name: bad}
    with pytest.raises(ValueError, match=name):
        policy_loss(**kwargs)  # type: ignore[arg-type]


def test_kl_coefficient_without_a_reference_is_an_error() -> None:
    kwargs = _good() | {"cfg": LossConfig(kl_coef=0.1)}
    with pytest.raises(ValueError, match="ref_logp"):
        policy_loss(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("loss_agg", "mean"),
        ("kl_estimator", "k2"),
        ("estimator", "ppo"),
        ("clip_low", 1.0),
        ("clip_high", -0.1),
        ("offpolicy", CorrectionSection(cap=0.0)),
        ("engine", CorrectionSection(low=1.5)),
        ("policy_loss", "reinforce"),
        ("kl_coef", -1.0),
    ],
)
def test_bad_config_names_the_field(field: str, bad: object) -> None:
    with pytest.raises(ValueError, match=field):
        LossConfig(**{field: bad})  # type: ignore[arg-type]


def test_low_precision_inputs_are_computed_in_float32() -> None:
    logp = torch.zeros(1, 2, dtype=torch.bfloat16, requires_grad=True)
    loss, _ = loss_of(logp, logp.detach(), [1.0], torch.ones(1, 2))
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert logp.grad is not None and logp.grad.dtype == torch.bfloat16
