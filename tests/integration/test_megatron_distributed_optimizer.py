"""The megatron engine's distributed optimizer over real processes (gloo): two
data-parallel copies, alone and each split into two pipeline stages (a tied embedding's
two copies on different owners), train two steps like the torch engine's one rank, while
each rank keeps AdamW's moments for its share of the parameters only.

Two steps, so the second runs on moments the first left on their owners; the whole state
gathered for a checkpoint and put back into the group comes out the same.
"""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from asyncrl.actors.training.gang import Gang
from asyncrl.actors.training.learner import Group, Learner
from asyncrl.runtime.contract.config import MegatronSection
from asyncrl.runtime.contract.gangs import GangPlace
from tests.integration.test_train_group import _config, _first_result, _lease
from tests.support.ranks import GROUP_SECRET, free_port, start_ranks

pytest.importorskip("megatron.core")

pytestmark = pytest.mark.timeout(180)

SPLITS = [  # (pipeline_parallel, ranks): two copies either way
    pytest.param((1, 2), id="two-copies"),
    pytest.param((2, 4), id="two-copies-of-two-stages"),
]
LEASES = (0, 1)


def _rank_main(rank: int, port: int, split: tuple[int, int], results) -> None:
    from asyncrl.actors.engines.megatron.model import load_megatron

    torch.set_num_threads(1)
    stages, ranks = split
    gang = Gang(GangPlace(rank, ranks, "127.0.0.1", port), secret=GROUP_SECRET, timeout_s=60)
    try:
        section = MegatronSection(pipeline_parallel=stages)
        assert section.distributed_optimizer  # the default
        model, codec = load_megatron("embedded", torch.float32, torch.device("cpu"), section)
        learner = Learner(model, _config(), codec.pad_id, group_size=ranks)
        stats = [learner.step([Group.of(i) for i in _lease(seed).items]) for seed in LEASES]
        kept = {
            name: sum(t.numel() for t in learner.optimizer.state[p].values() if t.dim() > 0)
            for name, p in model.named_parameters()
            if p in learner.optimizer.state
        }
        whole = {name: p.numel() for name, p in model.named_parameters()}
        weights = learner.full_weights()
        optimizer = learner.full_optimizer_state()
        learner.load_optimizer_state(optimizer)  # every rank the whole, each keeps its share
        again = learner.full_optimizer_state()
        same = all(
            torch.equal(again["state"][n][k], optimizer["state"][n][k])
            for n in optimizer["state"]
            for k in optimizer["state"][n]
        )
        results.put((rank, kept, whole, sorted(learner.optimized)))
        if rank == 0:
            arrays = {name: t.numpy() for name, t in weights.items()}
            moments = {
                n: {k: t.numpy() for k, t in entry.items()}
                for n, entry in optimizer["state"].items()
            }
            results.put(([s.grad_norm for s in stats], arrays, moments, same))
    finally:
        gang.close()


def _one_torch_rank():
    from asyncrl.actors.policy.checkpoint import load_model

    model, codec = load_model("embedded")
    learner = Learner(model, _config(), codec.pad_id)
    stats = [learner.step([Group.of(i) for i in _lease(seed).items]) for seed in LEASES]
    return stats, learner.full_weights(), learner.full_optimizer_state()["state"]


@pytest.mark.parametrize("split", SPLITS)
def test_copies_split_the_optimizer_state_and_train_like_one_torch_rank(
    split: tuple[int, int],
) -> None:
    torch.set_num_threads(1)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = start_ranks(_rank_main, split[1], port, split, results)
    shares, leader = {}, None
    while leader is None or len(shares) < split[1]:
        got = _first_result(results, ranks)
        if len(got) == 4 and isinstance(got[0], int):
            shares[got[0]] = got[1:]
        else:
            leader = got
    for process in ranks:
        process.join(30)
        assert process.exitcode == 0
    grad_norms, weights, moments, same = leader

    # The two ranks holding the same part of the model (one in each copy) split its
    # moments: every parameter's on exactly one of them, two moments of its size, and
    # neither keeps much more than half.
    parts: dict[tuple[str, ...], list] = {}
    for kept, whole, optimized in shares.values():
        assert set(kept) == set(optimized)
        assert all(kept[n] == 2 * whole[n] for n in kept)
        parts.setdefault(tuple(sorted(whole.items())), []).append(set(kept))
    assert len(parts) == split[0]
    for sizes, (kept, twin_kept) in parts.items():
        whole = dict(sizes)
        assert not kept & twin_kept
        assert kept | twin_kept == set(whole)
        total, largest = sum(whole.values()), max(whole.values())
        for held in (kept, twin_kept):
            assert sum(whole[n] for n in held) <= total / 2 + largest

    expected, expected_weights, expected_moments = _one_torch_rank()
    for got, want in zip(grad_norms, expected, strict=True):
        assert got == pytest.approx(want.grad_norm, rel=1e-5)
    worst = max(
        float((torch.from_numpy(weights[n]) - expected_weights[n]).abs().max()) for n in weights
    )
    assert worst <= 1e-4, f"weights after two steps differ by {worst}"  # 10% of lr
    assert sorted(moments) == sorted(expected_moments)
    for name, entry in expected_moments.items():
        for key in ("exp_avg", "exp_avg_sq"):
            gap = (torch.from_numpy(moments[name][key]) - entry[key]).abs().max()
            assert gap <= 1e-4 * max(float(entry[key].abs().max()), 1e-12), (name, key)
        assert float(torch.from_numpy(moments[name]["step"])) == 2.0
    assert same
