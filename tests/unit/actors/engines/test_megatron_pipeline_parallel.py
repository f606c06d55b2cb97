"""megatron's GPTModel split into two pipeline stages (gloo, CPU, one rank each) computes
what one unsplit model computes: whole logits and log-probs on both stages, the gradient
of every weight (the first stage's embedding and the last stage's output layer, summed
when they are one tied weight), the whole model's gradient norm, and the weights it gives
back by Hugging Face name. Each stage loads the whole checkpoint and keeps its layers.
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
from tests.unit.actors.engines.test_megatron_tensor_parallel import VARIANTS, inputs

pytest.importorskip("megatron.core")
pytest.importorskip("transformers")

pytestmark = [pytest.mark.timeout(180), pytest.mark.ranks]

STAGES = 2


def _stage(rank: int, port: int, directories: list[str], out: multiprocessing.Queue) -> None:
    import torch.distributed as dist

    from asyncrl.actors.engines.megatron.model import load_megatron
    from asyncrl.runtime.contract.config import MegatronSection

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, STAGES, rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=STAGES)
    try:
        for directory in directories:
            section = MegatronSection(pipeline_parallel=STAGES)
            model, _ = load_megatron(directory, torch.float32, torch.device("cpu"), section)
            ids, columns, targets, weights = inputs(model.config.vocab_size)
            with torch.no_grad():
                logits = model.eval()(ids)
            logprobs = model.token_logprobs(ids, columns, targets, Sampling(temperature=0.8))
            (logprobs * weights).sum().backward()  # the same loss on both stages
            model.finish_gradients()
            norm = model.clip_grad_norm(1e9)  # the norm only: nothing is scaled
            gpt = model.gpt
            if rank == 0:
                grad = gpt.embedding.word_embeddings.weight.grad
            else:
                grad = gpt.output_layer.weight.grad
            state = {name: t.numpy() for name, t in model.hf_state().items()}
            # numpy, not tensors: a queued tensor is shared by a handle that dies with us
            out.put(
                (
                    rank,
                    directory,
                    logits.numpy(),
                    logprobs.detach().numpy(),
                    grad.numpy(),
                    float(norm),
                    state,
                )
            )
    finally:
        dist.destroy_process_group()


def test_two_pipeline_stages_compute_what_one_model_does(tmp_path: Path) -> None:
    directories = [str(hf_model_dir(tmp_path / v, v)) for v in VARIANTS]
    results = run_ranks(_stage, 2, directories, results=STAGES * len(directories))
    for rank, directory, *arrays, norm, saved_arrays in results:
        logits, logprobs, grad = (torch.from_numpy(a) for a in arrays)
        weights = {name: torch.from_numpy(a) for name, a in saved_arrays.items()}
        ours, _ = load_model(directory)
        ids, columns, targets, loss_weights = inputs(ours.config.vocab_size)
        assert (logits - ours(ids).detach()).abs().max() <= 1e-4
        whole = torch.log_softmax(ours(ids, columns) / 0.8, dim=-1)
        expected = whole.gather(-1, targets[..., None]).squeeze(-1)
        (expected * loss_weights).sum().backward()
        assert (logprobs - expected.detach()).abs().max() <= 1e-4
        # Tied: both stages' copies hold the one weight's whole gradient.
        expected_grad = (ours.model.embed_tokens if rank == 0 else ours.lm_head).weight.grad
        assert (grad - expected_grad).abs().max() <= 1e-4
        expected_norm = torch.nn.utils.clip_grad_norm_(ours.parameters(), 1e9)
        assert norm == pytest.approx(float(expected_norm), rel=1e-5)
        saved = {name: t for name, t in ours.state_dict().items() if name in weights}
        assert sorted(saved) == sorted(weights)
        assert all(torch.equal(weights[name], saved[name]) for name in saved), directory
