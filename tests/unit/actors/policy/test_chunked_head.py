"""The output layer a chunk of tokens at a time (actors/policy/model.py
``_head_logprobs``): the same log-probabilities and the same gradients as the whole
log-softmax, tied and untied, at a temperature, with and without gradients."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy import model as model_module
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.sampling import Sampling
from asyncrl.actors.policy.scoring import pack, response_logprobs
from tests.support.hf_families import hf_model_dir


def _whole_softmax(model, packed, temperature: float) -> torch.Tensor:
    ids = packed.ids
    longest = packed.mask.shape[1]
    columns = (packed.starts[:, None] - 1 + torch.arange(longest)).clamp(max=ids.shape[1] - 2)
    tokens = ids[:, 1:][torch.arange(ids.shape[0])[:, None], columns]
    logits = model(ids[:, :-1], columns=columns).float() / temperature
    picked = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    return picked * packed.mask


@pytest.mark.parametrize("variant", ["qwen2-tied", "qwen3-untied-bias"])
def test_chunks_give_the_whole_softmax_and_its_gradients(
    tmp_path: Path, variant: str, monkeypatch
) -> None:
    model, _ = load_model(str(hf_model_dir(tmp_path, variant)))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 40, (n,), generator=generator).tolist() for n in (3, 5, 2)]
    responses = [torch.randint(3, 40, (n,), generator=generator).tolist() for n in (7, 4, 9)]
    packed = pack(prompts, responses, pad_id=0)

    def run(chunked: bool):
        model.zero_grad()
        if chunked:  # 4 tokens a chunk: 7 chunks of 27 positions
            monkeypatch.setattr(model_module, "HEAD_CHUNK_ELEMENTS", 4 * 40)
            got = response_logprobs(model, packed, Sampling(temperature=0.7))
        else:
            got = _whole_softmax(model, packed, temperature=0.7)
        (got * torch.linspace(-1, 1, got.numel()).view_as(got)).sum().backward()
        return got.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    expected, expected_grads = run(chunked=False)
    got, grads = run(chunked=True)
    assert (got - expected).abs().max() <= 1e-5
    for name, grad in grads.items():
        assert (grad - expected_grads[name]).abs().max() <= 1e-5, name
    with torch.no_grad():  # scoring: no recompute, the same numbers
        scored = response_logprobs(model, packed, Sampling(temperature=0.7))
        assert (scored - expected).abs().max() <= 1e-5
