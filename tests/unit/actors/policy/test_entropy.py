"""Token entropies from the output layer (model.py ``entropy_of`` and the ``entropy``
modes of ``_head_logprobs``): known distributions by hand, the sampling distribution's
temperature and truncation, chunks equal to the whole, gradients only when trained."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy import model as model_module
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.model import entropy_of
from asyncrl.actors.policy.sampling import Sampling
from asyncrl.actors.policy.scoring import pack, response_logprobs_and_entropy
from tests.support.hf_families import hf_model_dir

# probabilities 1/2, 1/4, 1/8, 1/8
HALVES = torch.tensor([[math.log(4.0), math.log(2.0), 0.0, 0.0]])
TWO_THIRDS = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))  # p = (2/3, 1/3)


def _entropy(logits: torch.Tensor, sampling: Sampling | None = None) -> float:
    return entropy_of((sampling or Sampling()).logprobs(logits)).item()


def test_entropy_of_known_distributions() -> None:
    assert _entropy(torch.zeros(1, 4)) == pytest.approx(math.log(4.0))
    # 1/2 ln 2 + 1/4 ln 4 + 2 * 1/8 ln 8 = (1/2 + 1/2 + 3/4) ln 2
    assert _entropy(HALVES) == pytest.approx(1.75 * math.log(2.0))
    assert _entropy(torch.tensor([[0.0, -1e4]])) == pytest.approx(0.0, abs=1e-6)


def test_entropy_of_the_temperature_scaled_distribution() -> None:
    # logits (ln 4, 0) at temperature 2 are (ln 2, 0): p = (2/3, 1/3)
    logits = torch.tensor([[math.log(4.0), 0.0]])
    assert _entropy(logits, Sampling(temperature=2.0)) == pytest.approx(TWO_THIRDS)


@pytest.mark.parametrize("sampling", [Sampling(top_k=2), Sampling(top_p=0.7)])
def test_entropy_of_the_truncated_distribution_counts_only_what_is_kept(sampling) -> None:
    # top-2 of (1/2, 1/4, 1/8, 1/8), or top-p 0.7 (1/2 is below 0.7, 3/4 reaches it): the
    # first two, renormalised to (2/3, 1/3); the dropped tokens add 0, not NaN.
    assert _entropy(HALVES, sampling) == pytest.approx(TWO_THIRDS)


def test_the_entropys_gradient_through_truncated_log_probs_is_finite() -> None:
    logits = HALVES.clone().requires_grad_(True)
    entropy_of(Sampling(top_k=2).logprobs(logits)).sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 2:].tolist() == [0.0, 0.0]  # the dropped tokens: no gradient


def _whole(model, packed, sampling: Sampling) -> torch.Tensor:
    """The entropy from the whole logits, the plain way: softmax, then -sum p log p."""
    ids = packed.ids
    longest = packed.mask.shape[1]
    columns = (packed.starts[:, None] - 1 + torch.arange(longest)).clamp(max=ids.shape[1] - 2)
    logits = model(ids[:, :-1], columns=columns).float() / sampling.temperature
    probs = torch.softmax(logits, -1)
    return -(probs * torch.log_softmax(logits, -1)).sum(-1) * packed.mask


@pytest.mark.parametrize("chunk_tokens", [None, 4])
def test_the_model_gives_the_entropy_of_what_it_scores_in_chunks_or_whole(
    tmp_path: Path, chunk_tokens: int | None, monkeypatch
) -> None:
    model, _ = load_model(str(hf_model_dir(tmp_path, "qwen2-tied")))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 40, (n,), generator=generator).tolist() for n in (3, 5)]
    responses = [torch.randint(3, 40, (n,), generator=generator).tolist() for n in (7, 4)]
    packed = pack(prompts, responses, pad_id=0)
    sampling = Sampling(temperature=0.7)
    expected = _whole(model, packed, sampling)
    vocab = model.config.vocab_size
    if chunk_tokens:
        monkeypatch.setattr(model_module, "HEAD_CHUNK_ELEMENTS", chunk_tokens * vocab)

    def grads(mode: str) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        logp, entropy = response_logprobs_and_entropy(model, packed, sampling, mode)
        (logp.sum() - entropy.sum()).backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logp.detach(), entropy.detach(), got

    logp, measured, measured_grads = grads("measured")
    assert (measured - expected.detach()).abs().max() <= 1e-5
    _, trained, trained_grads = grads("trained")
    assert (trained - measured).abs().max() <= 1e-6
    # "measured": the gradient is the log-probs' alone, as without any entropy.
    model.zero_grad()
    (model(*_inputs(packed), sampling=sampling) * packed.mask).sum().backward()
    for name, grad in measured_grads.items():
        expected_grad = model.get_parameter(name).grad
        scale = max(1.0, float(expected_grad.abs().max()))
        assert (grad - expected_grad).abs().max() <= 1e-5 * scale, name
    # "trained": the entropy's gradient too, as the whole logits' give it.
    model.zero_grad()
    whole_logp = _whole_logp(model, packed, sampling)
    (whole_logp.sum() - _whole(model, packed, sampling).sum()).backward()
    for name, grad in trained_grads.items():
        expected_grad = model.get_parameter(name).grad
        scale = max(1.0, float(expected_grad.abs().max()))
        assert (grad - expected_grad).abs().max() <= 1e-5 * scale, name
    assert measured.requires_grad is False and logp.shape == measured.shape


def _inputs(packed):
    from asyncrl.actors.policy.scoring import response_positions

    inputs, columns, tokens = response_positions(packed, torch.device("cpu"))
    return inputs, columns, tokens


def _whole_logp(model, packed, sampling: Sampling) -> torch.Tensor:
    inputs, columns, tokens = _inputs(packed)
    logits = model(inputs, columns=columns).float() / sampling.temperature
    picked = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    return picked * packed.mask
