"""megatron's GPTModel split over two tensor-parallel ranks (gloo, CPU) computes what one
unsplit model computes: whole logits, vocab-parallel log-probs, their gradients, and the
weights it gives back by Hugging Face name. Each rank loads the whole checkpoint and
keeps its part (the mapping's split), so this checks the split of every tensor kind:
q/k/v per query group, [gate; up] per half, row-parallel inputs, the vocabulary.
"""

from __future__ import annotations

import multiprocessing
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.sampling import Sampling
from tests.support.hf_families import hf_model_dir
from tests.support.ranks import run_ranks

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.timeout(180), pytest.mark.ranks]

VARIANTS = ("llama3-rope-untied-biases", "qwen3")  # untied + biases; tied + q/k norms
RANKS = 2
TRUNCATED = Sampling(temperature=0.8, top_p=0.9, top_k=5)


def inputs(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, vocab, (3, 12), generator=generator)
    columns = torch.tensor([[1, 4, 9], [0, 5, 11], [3, 3, 7]])
    targets = torch.randint(0, vocab, (3, 3), generator=generator)
    weights = torch.randn(3, 3, generator=generator)
    return ids, columns, targets, weights


def _rank(rank: int, port: int, directories: list[str], out: multiprocessing.Queue) -> None:
    import torch.distributed as dist

    from asyncrl.actors.engines.megatron.model import load_megatron
    from asyncrl.runtime.contract.config import MegatronSection

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, RANKS, rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=RANKS)
    try:
        for directory in directories:
            model, _ = load_megatron(
                directory, torch.float32, torch.device("cpu"), MegatronSection(tensor_parallel=2)
            )
            ids, columns, targets, weights = inputs(model.config.vocab_size)
            with torch.no_grad():
                logits = model.eval()(ids)
            logprobs = model.token_logprobs(ids, columns, targets, Sampling(temperature=0.8))
            (logprobs * weights).sum().backward()  # the same loss on both ranks
            grad = model.gpt.embedding.word_embeddings.weight.grad
            with torch.no_grad():  # top-k and top-p rank whole rows: the slices are joined
                truncated = model.token_logprobs(ids, columns, targets, TRUNCATED)
            weights = {name: t.numpy() for name, t in model.hf_state().items()}
            # numpy, not tensors: a queued tensor is shared by a handle that dies with us
            out.put(
                (
                    rank,
                    directory,
                    logits.numpy(),
                    logprobs.detach().numpy(),
                    grad.numpy(),
                    truncated.numpy(),
                    weights,
                )
            )
    finally:
        dist.destroy_process_group()


def test_two_tensor_parallel_ranks_compute_what_one_model_does(tmp_path: Path) -> None:
    directories = [str(hf_model_dir(tmp_path / v, v)) for v in VARIANTS]
    results = run_ranks(_rank, 2, directories, results=RANKS * len(directories))
    for rank, directory, *arrays, saved_arrays in results:
        logits, logprobs, grad, truncated = (torch.from_numpy(a) for a in arrays)
        weights = {name: torch.from_numpy(a) for name, a in saved_arrays.items()}
        ours, _ = load_model(directory)
        ids, columns, targets, loss_weights = inputs(ours.config.vocab_size)
        expected_logits = ours(ids)
        assert (logits - expected_logits.detach()).abs().max() <= 1e-4
        whole = torch.log_softmax(ours(ids, columns) / 0.8, dim=-1)
        expected = whole.gather(-1, targets[..., None]).squeeze(-1)
        (expected * loss_weights).sum().backward()
        assert (logprobs - expected.detach()).abs().max() <= 1e-4
        with torch.no_grad():
            scored = TRUNCATED.logprobs(ours(ids, columns), keep=targets)
        expected_truncated = scored.gather(-1, targets[..., None]).squeeze(-1)
        assert (truncated - expected_truncated).abs().max() <= 1e-4
        half = ours.config.vocab_size // RANKS
        expected_grad = ours.model.embed_tokens.weight.grad[rank * half : (rank + 1) * half]
        assert (grad - expected_grad).abs().max() <= 1e-4
        saved = {name: t for name, t in ours.state_dict().items() if name in weights}
        assert sorted(saved) == sorted(weights)
        assert all(torch.equal(weights[name], saved[name]) for name in saved), directory
