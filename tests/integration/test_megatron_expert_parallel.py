"""A Qwen3-MoE split over two expert-parallel ranks of the megatron engine (gloo, CPU),
alone and with two pipeline stages (4 ranks), or over two data-parallel copies, against
the torch engine's one rank on the same batch.

Expert-parallel ranks are data-parallel copies of the dense layers, each holding half of
the experts: they train different micro-batches (here 3 over 2 ranks, so one rank also
makes a pass only to pair up the collectives, and the ranks' batches differ in shape),
and every expert computes the tokens of both ranks routed to it. The step's loss,
gradient norm, updated weights and AdamW's moments (gathered by Hugging Face name, every
expert's included) must agree with one torch rank's; the gathered weights are the
checkpoint's, and a checkpoint goes back in and comes out the same. A scorer group split
the same ways scores as one torch model does, before and after a new version.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

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
)
from tests.support.group_step import (
    assert_scores_like_one_model,
    score_in_turn,
    step_and_reload,
)
from tests.support.hf_families import hf_model_dir
from tests.support.ranks import GROUP_SECRET, free_port, start_ranks

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

pytestmark = pytest.mark.timeout(180)

# (expert_parallel, pipeline_parallel, ranks): the tiny model has 2 layers, 1 a stage.
SPLITS = [
    pytest.param((2, 1, 2), id="expert-parallel"),
    # Every expert on both ranks: their gradients summed over the copies like the rest.
    pytest.param((1, 1, 2), id="data-parallel"),
    pytest.param((2, 2, 4), id="expert-and-pipeline-parallel", marks=pytest.mark.heavy),
]
# 4 experts, 2 per token: each rank holds 2; ids of the batches below are all < 40.
VARIANT = "qwen3-moe"


def _moe_dir(tmp_path: Path) -> str:
    return str(hf_model_dir(tmp_path / VARIANT, VARIANT))


def _next_version(directory: str) -> dict[str, torch.Tensor]:
    from asyncrl.actors.policy.checkpoint import load_model, state_for_saving

    model, _ = load_model(directory)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    return state_for_saving(model)


def _as_arrays(state: dict) -> dict:
    return {n: {k: t.numpy() for k, t in entry.items()} for n, entry in state["state"].items()}


def _section(split: tuple[int, int, int]) -> MegatronSection:
    return MegatronSection(expert_parallel=split[0], pipeline_parallel=split[1])


def _start(target, split: tuple[int, int, int], directory: str):
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = start_ranks(target, split[2], port, split, directory, results)
    return results, ranks


def _training_rank(rank: int, port: int, split, directory: str, results) -> None:
    from asyncrl.actors.engines.megatron.model import load_megatron

    torch.set_num_threads(1)
    gang = Gang(GangPlace(rank, split[2], "127.0.0.1", port), secret=GROUP_SECRET, timeout_s=60)
    try:
        section = _section(split)
        model, codec = load_megatron(directory, torch.float32, torch.device("cpu"), section)
        local = model.gpt.decoder.layers[0].mlp.experts.local_experts
        assert len(local) == 4 // split[0]
        learner = Learner(model, _config(), codec.pad_id, group_size=split[2])
        done = step_and_reload(learner, rank, _lease(), directory)
        if rank == 0:
            arrays = {name: t.numpy() for name, t in done.weights.items()}
            optimizer = _as_arrays(done.optimizer)
            stats = done.stats
            results.put(
                (
                    stats.metrics,
                    stats.grad_norm,
                    arrays,
                    optimizer,
                    done.same_weights,
                    done.same_moments,
                )
            )
    finally:
        gang.close()


@pytest.mark.parametrize("split", SPLITS)
def test_expert_parallel_ranks_train_like_one_torch_rank(
    tmp_path: Path, split: tuple[int, int, int]
) -> None:
    from asyncrl.actors.policy.checkpoint import load_model

    directory = _moe_dir(tmp_path)
    results, ranks = _start(_training_rank, split, directory)
    metrics, grad_norm, weights, moments, same_weights, same_moments = _first_result(results, ranks)
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    torch.set_num_threads(1)
    model, codec = load_model(directory)
    learner = Learner(model, _config(), codec.pad_id)
    expected = learner.step([Group.of(item) for item in _lease().items])
    expected_weights = learner.full_weights()
    expected_moments = learner.full_optimizer_state()["state"]

    assert metrics["loss"] == pytest.approx(expected.metrics["loss"], abs=1e-5)
    assert grad_norm == pytest.approx(expected.grad_norm, rel=1e-5)
    assert set(weights) == set(expected_weights)
    worst = max(
        float((torch.from_numpy(weights[n]) - expected_weights[n]).abs().max()) for n in weights
    )
    assert worst <= 5e-5, f"updated weights differ by {worst}"  # 5% of lr: see test_megatron_group
    # Every moment by name, the experts of both ranks among them.
    assert sorted(moments) == sorted(expected_moments)
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in moments
    for name, entry in expected_moments.items():
        for key in ("exp_avg", "exp_avg_sq"):
            gap = (torch.from_numpy(moments[name][key]) - entry[key]).abs().max()
            assert gap <= 1e-5 * max(float(entry[key].abs().max()), 1e-12), (name, key)
    assert same_weights and same_moments


def _scoring_rank(rank: int, port: int, split, directory: str, results) -> None:
    from asyncrl.actors.engines.contract import load_group_weights
    from asyncrl.actors.engines.megatron.model import load_megatron

    torch.set_num_threads(1)
    gang = Gang(GangPlace(rank, split[2], "127.0.0.1", port), secret=GROUP_SECRET, timeout_s=60)
    try:
        section = _section(split)
        model, codec = load_megatron(directory, torch.float32, torch.device("cpu"), section)

        def load_version() -> None:  # whole on rank 0, each rank keeps its experts
            load_group_weights(model, _next_version(directory) if rank == 0 else None)

        score_in_turn(model, _SCORED, codec.pad_id, gang, rank, load_version, results)
    finally:
        gang.close()


@pytest.mark.parametrize("split", SPLITS)
def test_an_expert_parallel_scorer_group_scores_and_loads_versions_like_one_torch_model(
    tmp_path: Path, split: tuple[int, int, int]
) -> None:
    """20 rows (10 a rank), then 1 (a rank with no rows pairs up anyway), then 20 under a
    new version."""

    directory = _moe_dir(tmp_path)
    results, ranks = _start(_scoring_rank, split, directory)
    shared = [_first_result(results, ranks) for _ in range(_SCORES)]
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    assert_scores_like_one_model(shared, directory, _SCORED, _next_version(directory), 1e-4)


@pytest.mark.parametrize(
    "split",
    [
        pytest.param((2, 1, 2), id="expert-parallel"),
        pytest.param((2, 1, 4), id="expert-and-data-parallel"),
    ],
)
def test_each_expert_parallel_rank_publishes_its_experts_and_the_parts_make_the_weights(
    tmp_path: Path, split: tuple[int, int, int]
) -> None:
    """Each expert-parallel rank publishes its own block of the experts (numbered as in
    the whole model), the first also the dense layers; the second data-parallel copy of
    the experts nothing."""
    from tests.integration.test_megatron_group import check_every_ranks_slice_makes_the_weights

    experts, stages, ranks = split
    fields = {"expert_parallel": experts, "pipeline_parallel": stages}
    check_every_ranks_slice_makes_the_weights(_moe_dir(tmp_path), fields, ranks)
