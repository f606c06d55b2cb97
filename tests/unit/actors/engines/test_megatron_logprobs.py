"""Vocabulary-parallel log-probs equal plain ``log_softmax`` + ``gather``, and their
entropies plain ``-sum(p log p)``: on one rank, and on two gloo ranks each holding half
of the vocabulary (values and gradients)."""

from __future__ import annotations

import multiprocessing
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from asyncrl.actors.engines.megatron.logprobs import (
    vocab_parallel_logprobs,
    vocab_parallel_logprobs_and_entropy,
)
from tests.support.ranks import run_ranks

VOCAB = 10  # padded to 12 for two ranks of 6 columns


def example(vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    logits = 4 * torch.randn(3, 5, vocab, generator=generator)
    targets = torch.randint(0, vocab, (3, 5), generator=generator)
    weights = torch.randn(3, 5, generator=generator)
    return logits, targets, weights


def plain(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_one_rank_is_log_softmax(temperature: float) -> None:
    logits, targets, _ = example()
    got = vocab_parallel_logprobs(logits, targets, temperature=temperature)
    torch.testing.assert_close(got, plain(logits, targets, temperature), rtol=0, atol=1e-6)


def test_padding_columns_get_no_probability() -> None:
    logits, targets, _ = example()
    padded = torch.cat((logits, torch.full((3, 5, 2), 50.0)), dim=-1)
    got = vocab_parallel_logprobs(padded, targets, vocab=VOCAB)
    torch.testing.assert_close(got, plain(logits, targets), rtol=0, atol=1e-6)


def plain_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logprobs.exp() * logprobs).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_one_rank_gives_the_entropy_of_the_real_vocabulary(temperature: float) -> None:
    logits, targets, _ = example()
    padded = torch.cat((logits, torch.full((3, 5, 2), 50.0)), dim=-1)
    for mode in ("measured", "trained"):
        got, spread = vocab_parallel_logprobs_and_entropy(
            padded, targets, vocab=VOCAB, temperature=temperature, entropy=mode
        )
        torch.testing.assert_close(got, plain(logits, targets, temperature), rtol=0, atol=1e-6)
        torch.testing.assert_close(spread, plain_entropy(logits, temperature), rtol=0, atol=1e-5)
    off = vocab_parallel_logprobs_and_entropy(padded, targets, vocab=VOCAB, entropy="off")
    assert off[1] is None


def test_a_uniform_row_has_the_entropy_log_vocab() -> None:
    _, spread = vocab_parallel_logprobs_and_entropy(
        torch.zeros(1, 8), torch.zeros(1, dtype=torch.long), entropy="measured"
    )
    assert spread.item() == pytest.approx(torch.log(torch.tensor(8.0)).item())


def _rank(rank: int, port: int, out: multiprocessing.Queue) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    try:
        logits, targets, weights = example()
        padded = torch.cat((logits, torch.full((3, 5, 2), 50.0)), dim=-1)
        mine = padded[..., rank * 6 : (rank + 1) * 6].clone().requires_grad_()
        got = vocab_parallel_logprobs(mine, targets, dist.group.WORLD, vocab=VOCAB)
        (got * weights).sum().backward()  # the same loss on both ranks, as in training
        # The same with the entropy trained too: log-probs plus entropies, weighted.
        again = padded[..., rank * 6 : (rank + 1) * 6].clone().requires_grad_()
        picked, spread = vocab_parallel_logprobs_and_entropy(
            again, targets, dist.group.WORLD, VOCAB, entropy="trained"
        )
        ((picked + spread) * weights).sum().backward()
        # numpy, not tensors: a queued tensor is shared by a handle that dies with us
        arrays = (got, mine.grad, spread, again.grad)
        out.put((rank, *(a.detach().numpy() for a in arrays)))
    finally:
        dist.destroy_process_group()


@pytest.mark.ranks
def test_two_ranks_give_the_log_probs_and_gradients_of_one() -> None:
    reported = run_ranks(_rank, 2, results=2, timeout=120)
    results = {rank: arrays for rank, *arrays in reported}
    logits, targets, weights = example()
    whole = logits.clone().requires_grad_()
    expected = plain(whole, targets)
    (expected * weights).sum().backward()
    grad = torch.cat((whole.grad, torch.zeros(3, 5, 2)), dim=-1)
    both = logits.clone().requires_grad_()
    expected_spread = plain_entropy(both)
    ((plain(both, targets) + expected_spread) * weights).sum().backward()
    both_grad = torch.cat((both.grad, torch.zeros(3, 5, 2)), dim=-1)
    for rank, arrays in results.items():
        got, shard_grad, spread, spread_grad = (torch.from_numpy(a) for a in arrays)
        columns = slice(rank * 6, (rank + 1) * 6)
        torch.testing.assert_close(got, expected.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(shard_grad, grad[..., columns], rtol=0, atol=1e-5)
        torch.testing.assert_close(spread, expected_spread.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(spread_grad, both_grad[..., columns], rtol=0, atol=1e-5)
