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
from tests.support.receiving import received

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


def _publishing_rank(
    rank: int, port: int, ranks: int, model_dir: str, split: dict, results, fetched
) -> None:
    """A megatron rank (split by ``split``, MegatronSection's fields) after a step: the
    group's weights gathered whole (the leader's), and this rank's own slice published
    with a publisher of its own, as a run's ranks publish every version
    (rank.publish_parts). Each serves until the test fetched."""
    from asyncrl.actors.engines.megatron.model import load_megatron
    from asyncrl.actors.training.rank import publish_parts
    from asyncrl.transport.weights.ucx import UcxPublisher

    torch.set_num_threads(1)
    torch.manual_seed(0)
    gang = Gang(GangPlace(rank, ranks, "127.0.0.1", port), secret=GROUP_SECRET, timeout_s=60)
    publisher = UcxPublisher(bucket_mb=1)
    try:
        section = MegatronSection(**split)
        model, codec = load_megatron(model_dir, torch.float32, torch.device("cpu"), section)
        learner = Learner(model, _config(), codec.pad_id, group_size=ranks)
        learner.step([Group.of(item) for item in _lease().items])
        whole = learner.full_weights()
        own = learner.own_part()
        sent = 0 if own is None else sum(t.nbytes for t in own.tensors.values())
        announced = publish_parts(own, publisher if own else None, 1, leader=rank == 0)
        if announced is not None:
            arrays = {name: t.numpy() for name, t in whole.items()}
            results.put((announced.manifest, announced.address, arrays, sent))
        else:
            results.put(("part", None, None, sent))
        fetched.wait(120)
    finally:
        publisher.close()
        gang.close()


def check_every_ranks_slice_makes_the_weights(model_dir: str, split: dict, ranks: int) -> None:
    """A group of ``ranks`` megatron ranks split by ``split`` publishes a version from
    every rank (weights.from_every_rank): a generator's receiver assembles exactly the
    weights the group gathers whole; no rank sent the whole model, nothing was sent
    twice, and a second data-parallel copy sent nothing."""
    from asyncrl.transport.weights import WeightsPlan
    from asyncrl.transport.weights.parts import part_count
    from asyncrl.transport.weights.parts_receiver import PartsReceiver
    from asyncrl.transport.weights.ucx import UcxReceiver

    torch.set_num_threads(1)
    context = multiprocessing.get_context("spawn")
    results, fetched = context.Queue(), context.Event()
    processes = start_ranks(
        _publishing_rank, ranks, free_port(), ranks, model_dir, split, results, fetched
    )
    try:
        said = [_first_result(results, processes) for _ in range(ranks)]
        manifest, address, expected, _ = next(s for s in said if s[0] != "part")
        parts = part_count(manifest)
        assert parts == MegatronSection(**split).model_parallel
        receiver = PartsReceiver([UcxReceiver(relay=False) for _ in range(parts)])
        state = received(receiver, WeightsPlan(1, manifest, "train-0", address)).state
    finally:
        fetched.set()
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    assert sorted(state) == sorted(expected)
    for name, array in expected.items():
        assert torch.equal(state[name], torch.from_numpy(array)), name
    sent = sorted(s[3] for s in said)
    whole = sum(a.nbytes for a in expected.values())
    assert max(sent) < 0.75 * whole and sum(sent) == whole, (sent, whole)
    assert sent.count(0) == ranks - parts


# One copy split over its ranks (a version in parts), and two copies of a split (the
# second copy publishes nothing). Data parallelism alone publishes whole (weight_parts).
PUBLISHING = [
    *(s for s in SPLITS if s.id != "data-parallel"),
    pytest.param((2, 1, 4), id="tensor-and-data-parallel"),
]


@pytest.mark.parametrize("split", PUBLISHING)
def test_each_megatron_rank_publishes_its_slice_and_the_parts_make_the_groups_weights(
    split: tuple[int, int, int],
) -> None:
    """Each tensor-parallel rank of each stage publishes its own rows and columns by
    Hugging Face name, a data-parallel copy nothing."""
    tensor_parallel, pipeline_parallel, ranks = split
    fields = {"tensor_parallel": tensor_parallel, "pipeline_parallel": pipeline_parallel}
    check_every_ranks_slice_makes_the_weights("embedded", fields, ranks)
