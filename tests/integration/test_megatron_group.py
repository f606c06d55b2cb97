"""The megatron engine's trainer and scorers as groups of real processes (gloo) against
the torch engine's one rank on the same batch: 2 ranks split by tensor parallelism (one
copy of the model over both), by data parallelism (a whole copy on each) and by pipeline
parallelism (two stages of two layers each); 4 ranks split both ways (2 x 2).

The step's loss, gradient norm and updated weights must agree to fp32 rounding, and so
must AdamW's moments, gathered by Hugging Face name as a checkpoint stores them. A
checkpoint's weights and optimizer state go back into the group (rank 0 reads the
weights, every rank the optimizer state) and come out the same.
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from asyncrl.actors.training.gang import Gang
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.runtime.contract.config import MegatronSection
from asyncrl.runtime.contract.gangs import GangPlace
from tests.integration.test_train_group import (
    _SCORED,
    _SCORES,
    _config,
    _first_result,
    _lease,
    _next_version,
)
from tests.support.group_step import (
    assert_scores_like_one_model,
    score_in_turn,
    step_and_reload,
)
from tests.support.ranks import GROUP_SECRET, free_port, start_ranks

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.timeout(180)

MOMENT = "model.layers.0.self_attn.q_proj.weight"  # fused with k and v on megatron's side

# (tensor_parallel, pipeline_parallel, ranks): the embedded model has 4 layers, tied
# embeddings (split over 2 stages, its two copies must stay one weight).
SPLITS = [
    pytest.param((2, 1, 2), id="tensor-parallel"),
    pytest.param((1, 1, 2), id="data-parallel"),
    pytest.param((1, 2, 2), id="pipeline-parallel"),
    pytest.param((2, 2, 4), id="tensor-and-pipeline-parallel"),
]


def _rank_main(rank: int, port: int, split: tuple[int, int, int], results) -> None:
    from asyncrl.actors.engines.megatron.model import load_megatron

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tensor_parallel, pipeline_parallel, ranks = split
    gang = Gang(GangPlace(rank, ranks, "127.0.0.1", port), secret=GROUP_SECRET, timeout_s=60)
    try:
        section = MegatronSection(
            tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel
        )
        model, codec = load_megatron("embedded", torch.float32, torch.device("cpu"), section)
        # with an entropy bonus: its gradient through the split vocabulary and the stages
        learner = Learner(model, _config(bonus=True), codec.pad_id, group_size=ranks)
        done = step_and_reload(learner, rank, _lease(), "embedded")
        if rank == 0:
            moment = done.optimizer["state"][MOMENT]["exp_avg_sq"].numpy()
            arrays = {name: t.numpy() for name, t in done.weights.items()}
            stats = done.stats
            results.put(
                (
                    stats.metrics,
                    stats.grad_norm,
                    arrays,
                    moment,
                    done.same_weights,
                    done.same_moments,
                )
            )
    finally:
        gang.close()


def _one_rank():
    from asyncrl.actors.policy.checkpoint import load_model

    torch.manual_seed(0)
    model, codec = load_model("embedded")
    learner = Learner(model, _config(bonus=True), codec.pad_id)
    stats = learner.step([Group.of(item) for item in _lease().items])
    moment = learner.full_optimizer_state()["state"][MOMENT]["exp_avg_sq"]
    return stats, learner.full_weights(), moment


@pytest.mark.parametrize("split", SPLITS)
def test_megatron_ranks_train_like_one_torch_rank(split: tuple[int, int, int]) -> None:
    torch.set_num_threads(1)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    args = (port, split, results)
    ranks = start_ranks(_rank_main, split[2], *args)
    metrics, grad_norm, weights, moment, same_weights, same_moments = _first_result(results, ranks)
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    expected, expected_weights, expected_moment = _one_rank()
    assert metrics["loss"] == pytest.approx(expected.metrics["loss"], abs=1e-5)
    assert metrics["entropy"] == pytest.approx(expected.metrics["entropy"], abs=1e-5)
    assert grad_norm == pytest.approx(expected.grad_norm, rel=1e-5)
    assert set(weights) == set(expected_weights)
    worst = max(
        float((torch.from_numpy(weights[n]) - expected_weights[n]).abs().max()) for n in weights
    )
    # AdamW's first step moves each weight by about lr whatever its gradient's size, so a
    # gradient near zero turns the engines' float rounding into a visible difference:
    # the weights agree to 10% of lr (1e-3), the gradients (in the moments) to 1e-5 of
    # their size. (How the step's rows fall into micro-batches moves that rounding.)
    assert worst <= 1e-4, f"updated weights differ by {worst}"
    moment_gap = (torch.from_numpy(moment) - expected_moment).abs().max()
    assert moment_gap <= 1e-5 * expected_moment.abs().max()
    assert same_weights and same_moments


def _scoring_rank(rank: int, port: int, split: tuple[int, int, int], results) -> None:
    from asyncrl.actors.engines.contract import load_group_weights
    from asyncrl.actors.engines.megatron.model import load_megatron

    torch.set_num_threads(1)
    tensor_parallel, pipeline_parallel, ranks = split
    gang = Gang(GangPlace(rank, ranks, "127.0.0.1", port), secret=GROUP_SECRET, timeout_s=60)
    try:
        section = MegatronSection(
            tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel
        )
        model, codec = load_megatron("embedded", torch.float32, torch.device("cpu"), section)

        def load_version() -> None:  # whole on rank 0, each rank keeps its part
            load_group_weights(model, _next_version() if rank == 0 else None)

        score_in_turn(model, _SCORED, codec.pad_id, gang, rank, load_version, results)
    finally:
        gang.close()


@pytest.mark.parametrize("split", SPLITS)
def test_a_megatron_scorer_group_scores_and_loads_versions_like_one_torch_model(
    split: tuple[int, int, int],
) -> None:
    """20 rows, then 1 (a copy with no rows pairs up anyway), then 20 under a new version."""

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    args = (port, split, results)
    ranks = start_ranks(_scoring_rank, split[2], *args)
    shared = [_first_result(results, ranks) for _ in range(_SCORES)]
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    assert_scores_like_one_model(shared, "embedded", _SCORED, _next_version(), 1e-4)


@pytest.fixture
def _megatron_groups_torn_down():
    """megatron's groups (and the one-rank default group under them) made in this
    process are gone after the test, for the tests that follow in it."""
    yield
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.usefixtures("_megatron_groups_torn_down")
def test_a_checkpoints_optimizer_state_moves_between_the_engines_both_ways() -> None:
    """Both store AdamW's state by Hugging Face name in torch's layout, so a run can
    resume from the other engine's checkpoint."""
    from asyncrl.actors.engines.megatron.model import load_megatron
    from asyncrl.actors.policy.checkpoint import load_model

    torch.set_num_threads(1)
    model, codec = load_model("embedded")
    ours = Learner(model, _config(), codec.pad_id)
    ours.step([Group.of(item) for item in _lease().items])
    saved = ours.full_optimizer_state()
    megatron, _ = load_megatron("embedded", torch.float32, torch.device("cpu"), MegatronSection())
    theirs = Learner(megatron, _config(), codec.pad_id)
    theirs.load_optimizer_state(saved)
    moved = theirs.full_optimizer_state()
    back_model, _ = load_model("embedded")
    back = Learner(back_model, _config(), codec.pad_id)
    back.load_optimizer_state(moved)
    for state in (moved, back.full_optimizer_state()):
        assert sorted(state["state"]) == sorted(saved["state"])
        for name, entry in saved["state"].items():
            assert all(torch.equal(state["state"][name][k], entry[k]) for k in entry), name
    assert all(
        isinstance(p, torch.nn.Parameter) for p in theirs.optimizer.param_groups[0]["params"]
    )
