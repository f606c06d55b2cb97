"""Sampling with a temperature, top-k, top-p and seeds, in the decoder and the scorers:
what the decoder draws and records is the distribution the scorers recompute."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder, Finished, Request, check_request
from asyncrl.actors.policy.model import CausalLM
from asyncrl.actors.policy.sampling import Sampling, sampled_logprobs
from asyncrl.actors.policy.scoring import pack, response_logprobs
from asyncrl.actors.policy.tokenizer import TextCodec

PROMPTS = ["1+2=", "345+6789=", "7=", "12+3=", "99999+1=", "4+56="]
# The packaged model is sharp: at temperature 1 it nearly always writes its most likely
# token. Hot enough, its samples differ from its greedy answers and from each other.
HOT = 4.0


@pytest.fixture(scope="module")
def embedded() -> tuple[CausalLM, TextCodec]:
    return load_model("embedded")


def _decode(
    model: CausalLM, codec: TextCodec, requests: list[Request], **settings
) -> dict[object, Finished]:
    decoder = Decoder(
        model,
        slots=4,  # fewer than the requests: sequences join as others end
        max_new_tokens=12,
        max_prompt_tokens=16,
        eos_id=codec.eos_id,
        pad_id=codec.pad_id,
        **settings,
    )
    decoder.submit(requests)
    finished: list[Finished] = []
    while decoder.busy:
        finished += decoder.step()
    return {f.tag: f for f in finished}


def _prompt(codec: TextCodec, i: int) -> tuple[int, ...]:
    return tuple(codec.encode(PROMPTS[i % len(PROMPTS)]))


def _greedy(model, codec, count: int) -> dict[object, Finished]:
    return _decode(model, codec, [Request(i, _prompt(codec, i), greedy=True) for i in range(count)])


def test_top_k_of_one_and_a_tiny_top_p_give_the_greedy_tokens(embedded) -> None:
    model, codec = embedded
    greedy = _greedy(model, codec, 6)
    for truncation in ({"top_k": 1}, {"top_p": 1e-6}):
        hot = _decode(
            model,
            codec,
            [Request(i, _prompt(codec, i), **truncation) for i in range(6)],
            temperature=HOT,
        )
        for i in range(6):
            assert hot[i].tokens == greedy[i].tokens, truncation
            # One token kept: it had all the probability.
            assert hot[i].logprobs == pytest.approx([0.0] * len(hot[i].tokens), abs=1e-6)
    # The same as the decoder's own default, for requests that name none.
    by_default = _decode(
        model, codec, [Request(i, _prompt(codec, i)) for i in range(6)], temperature=HOT, top_k=1
    )
    assert [by_default[i].tokens for i in range(6)] == [greedy[i].tokens for i in range(6)]
    # Unrestricted, that hot, the samples are not the greedy answers: the checks above see.
    free = _decode(model, codec, [Request(i, _prompt(codec, i)) for i in range(6)], temperature=HOT)
    assert any(free[i].tokens != greedy[i].tokens for i in range(6))


def test_a_seed_draws_the_same_tokens_whatever_shares_the_batch(embedded) -> None:
    model, codec = embedded
    prompt = _prompt(codec, 1)
    alone = _decode(model, codec, [Request("s", prompt, seed=11)], temperature=HOT, seed=0)
    crowded = _decode(
        model,
        codec,
        # Other sequences before and after it, hot and truncated, and another decoder seed.
        [Request(i, _prompt(codec, i), temperature=2.0, top_p=0.9) for i in range(3)]
        + [Request("s", prompt, seed=11)]
        + [Request(i, _prompt(codec, i), top_k=3) for i in range(3, 7)],
        temperature=HOT,
        seed=5,
    )
    assert crowded["s"].tokens == alone["s"].tokens
    assert crowded["s"].logprobs == pytest.approx(alone["s"].logprobs, abs=1e-4)
    others = _decode(
        model, codec, [Request(s, prompt, seed=s) for s in range(12, 18)], temperature=HOT
    )
    assert any(others[s].tokens != alone["s"].tokens for s in others), "seeds draw alike"


def _independent_logprobs(
    logits: torch.Tensor, temperature: float, top_p: float, top_k: int, min_p: float = 0.0
):
    """The sampled distribution's log-probs, one row at a time, written plainly."""
    rows = []
    for row in logits.double():
        scaled = row / temperature
        kept = set(range(len(row)))
        if min_p > 0:  # a token's probability over the most likely one's
            kept = {t for t in kept if math.exp(scaled[t] - scaled.max()) >= min_p}
        if top_k > 0:
            ranked = sorted((scaled[t].item() for t in kept), reverse=True)
            kth = ranked[min(top_k, len(ranked)) - 1]
            kept = {t for t in kept if scaled[t] >= kth}
        if top_p < 1:
            probs = torch.full_like(scaled, 0.0)
            exps = {t: math.exp(scaled[t] - scaled.max()) for t in kept}
            for t, e in exps.items():
                probs[t] = e / sum(exps.values())
            mass, least = 0.0, None
            for t in sorted(kept, key=lambda t: -probs[t]):
                if mass >= top_p:
                    break
                mass, least = mass + probs[t], probs[t]
            kept = {t for t in kept if probs[t] >= least}
        masked = torch.full_like(scaled, -math.inf)
        masked[sorted(kept)] = scaled[sorted(kept)]
        rows.append(torch.log_softmax(masked, -1))
    return torch.stack(rows)


SETTINGS = [(HOT, 1.0, 5), (2.0, 0.8, 0), (HOT, 0.9, 4), (0.7, 1.0, 0), (3.0, 0.97, 0)]


def test_recorded_log_probs_are_of_the_truncated_tempered_distribution(embedded) -> None:
    model, codec = embedded
    requests = [
        Request(i, _prompt(codec, i), temperature=t, top_p=p, top_k=k, seed=i)
        for i, (t, p, k) in enumerate(SETTINGS)
    ]
    finished = _decode(model, codec, requests)  # every row its own settings, in one batch
    for i, (t, p, k) in enumerate(SETTINGS):
        f = finished[i]
        ids = torch.tensor([[*f.prompt, *f.tokens]])
        with torch.no_grad():
            logits = model(ids)[0, len(f.prompt) - 1 : -1]
        expected = _independent_logprobs(logits, t, p, k)
        picked = expected.gather(1, torch.tensor(f.tokens)[:, None]).squeeze(1)
        assert torch.isfinite(picked).all(), f"a token outside the kept set: {SETTINGS[i]}"
        torch.testing.assert_close(
            torch.tensor(f.logprobs, dtype=torch.float64), picked, rtol=0, atol=1e-4
        )


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), SETTINGS)
def test_the_scorer_recomputes_what_the_decoder_recorded(
    embedded, temperature: float, top_p: float, top_k: int
) -> None:
    model, codec = embedded
    sampling = Sampling(temperature, top_p, top_k)
    finished = _decode(
        model,
        codec,
        [Request(i, _prompt(codec, i)) for i in range(6)],
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
    )
    rows = [finished[i] for i in range(6)]
    packed = pack([list(f.prompt) for f in rows], [f.tokens for f in rows], codec.pad_id)
    with torch.no_grad():
        scored = response_logprobs(model, packed, sampling)
    for row, f in enumerate(rows):
        recorded = torch.tensor(f.logprobs)
        torch.testing.assert_close(scored[row, : len(f.tokens)], recorded, rtol=0, atol=1e-5)


def test_truncated_scores_train_and_never_leave_the_sampled_token_out(embedded) -> None:
    model, codec = embedded
    prompt, response = list(_prompt(codec, 0)), list(_prompt(codec, 3))  # unlikely tokens
    packed = pack([prompt], [response], codec.pad_id)
    model.zero_grad()
    scored = response_logprobs(model, packed, Sampling(1.0, 0.5, 2))
    assert torch.isfinite(scored).all()
    scored.sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.zero_grad()


def test_per_row_settings_are_each_rows_own() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    settings = [(1.0, 1.0, 0), (0.5, 0.9, 0), (2.0, 1.0, 7), (1.3, 0.6, 12)]
    together = sampled_logprobs(
        logits,
        torch.tensor([s[0] for s in settings]),
        torch.tensor([s[1] for s in settings]),
        torch.tensor([s[2] for s in settings]),
    )
    for row, (t, p, k) in enumerate(settings):
        alone = sampled_logprobs(logits[row : row + 1], t, p, k)
        torch.testing.assert_close(together[row : row + 1], alone)
        expected = _independent_logprobs(logits[row : row + 1], t, p, k).float()
        torch.testing.assert_close(alone, expected, atol=1e-5, rtol=0)
    # Untruncated rows keep every token, whatever the others do.
    assert torch.isfinite(together[0]).all() and torch.isfinite(together[2]).sum() == 7


def test_ties_at_the_edge_are_kept_whole() -> None:
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0]])
    assert torch.isfinite(sampled_logprobs(logits, top_k=2)).sum() == 4
    # 0.69 of the mass in the first; the next two reach 0.87, and the fourth ties with them.
    assert torch.isfinite(sampled_logprobs(logits, top_p=0.8)).sum() == 4
    assert torch.isfinite(sampled_logprobs(logits, top_p=0.5)).sum() == 1


def test_min_p_keeps_the_tokens_that_likely_against_the_most_likely_one() -> None:
    logits = torch.tensor([[2.0, 2.0, 1.0, 0.0, -3.0]])
    # Against the most likely (two, tied): e^-1 = 0.37, e^-2 = 0.14, e^-5 = 0.007.
    both = math.log(2 * math.e**2 + math.e)
    expected = [2 - both, 2 - both, 1 - both, -math.inf, -math.inf]
    got = sampled_logprobs(logits, min_p=0.3)
    torch.testing.assert_close(got[0], torch.tensor(expected), rtol=0, atol=1e-6)
    # Above e^-1 only the tied most likely pair is left, each half.
    half = math.log(0.5)
    expected = [half, half, -math.inf, -math.inf, -math.inf]
    torch.testing.assert_close(sampled_logprobs(logits, min_p=0.5)[0], torch.tensor(expected))
    # After the temperature: at 2, e^-0.5 = 0.61 and e^-1 = 0.37 against the most likely.
    assert torch.isfinite(sampled_logprobs(logits, 2.0, min_p=0.5)).sum() == 3
    assert torch.isfinite(sampled_logprobs(logits, 2.0, min_p=0.3)).sum() == 4
    # Tied tokens fall the same side, whatever the threshold.
    tied = torch.tensor([[1.0, 0.0, 0.0, 0.0, -1.0]])
    for min_p in (0.2, 0.3, 0.36, 0.37, 0.5):
        assert torch.isfinite(sampled_logprobs(tied, min_p=min_p)[0, 1:4]).sum() in (0, 3)


def test_min_p_comes_before_top_k_and_top_p_as_in_vllm() -> None:
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    # min_p 0.3 leaves 0.4, 0.3, 0.2 (0.44, 0.33, 0.22 renormalized); top_p 0.75 is then
    # reached by the first two. Top-p first, over all four, would have kept three.
    expected = torch.tensor([0.4 / 0.7, 0.3 / 0.7, 0.0, 0.0]).log()
    got = sampled_logprobs(logits, top_p=0.75, min_p=0.3)
    torch.testing.assert_close(got[0], expected, rtol=0, atol=1e-6)
    assert torch.isfinite(sampled_logprobs(logits, top_p=0.75)).sum() == 3
    # Fewer tokens left than top_k asks for: min_p's set stands.
    assert torch.isfinite(sampled_logprobs(logits, top_k=3, min_p=0.3)).sum() == 3
    assert torch.isfinite(sampled_logprobs(logits, top_k=2, min_p=0.3)).sum() == 2


def test_min_p_per_row_and_against_the_plain_definition() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1)) * 3
    settings = [(1.0, 1.0, 0, 0.0), (0.7, 0.9, 0, 0.05), (2.0, 1.0, 9, 0.2), (1.3, 0.8, 12, 0.1)]
    together = sampled_logprobs(
        logits,
        torch.tensor([s[0] for s in settings]),
        torch.tensor([s[1] for s in settings]),
        torch.tensor([s[2] for s in settings]),
        min_p=torch.tensor([s[3] for s in settings]),
    )
    for row, (t, p, k, m) in enumerate(settings):
        alone = Sampling(t, p, k, m).logprobs(logits[row : row + 1])
        torch.testing.assert_close(together[row : row + 1], alone)
        expected = _independent_logprobs(logits[row : row + 1], t, p, k, m).float()
        torch.testing.assert_close(alone, expected, atol=1e-5, rtol=0)
    assert torch.isfinite(together[0]).all() and not torch.isfinite(together[1:]).all()


def test_the_scorer_recomputes_what_the_decoder_recorded_under_min_p(embedded) -> None:
    model, codec = embedded
    sampling = Sampling(HOT, 0.95, 8, 0.05)
    assert sampling.truncates
    finished = _decode(
        model,
        codec,
        [Request(i, _prompt(codec, i), seed=i) for i in range(6)],
        temperature=HOT,
        top_p=0.95,
        top_k=8,
        min_p=0.05,
    )
    rows = [finished[i] for i in range(6)]
    packed = pack([list(f.prompt) for f in rows], [f.tokens for f in rows], codec.pad_id)
    with torch.no_grad():
        scored = response_logprobs(model, packed, sampling)
    for row, f in enumerate(rows):
        torch.testing.assert_close(
            scored[row, : len(f.tokens)], torch.tensor(f.logprobs), rtol=0, atol=1e-5
        )
        ids = torch.tensor([[*f.prompt, *f.tokens]])
        with torch.no_grad():
            logits = model(ids)[0, len(f.prompt) - 1 : -1]
        plain = _independent_logprobs(logits, HOT, 0.95, 8, 0.05)
        picked = plain.gather(1, torch.tensor(f.tokens)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(f.logprobs).double(), picked, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"min_p": 1.0}, "min_p=1.0"),
        ({"min_p": -0.1}, "min_p=-0.1"),
        ({"min_p": True}, "min_p=True"),
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"temperature": -1}, "temperature=-1"),
        ({"top_p": 0.0}, "top_p=0.0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_k": -1}, "top_k=-1"),
        ({"top_k": 2.5}, "top_k=2.5"),
        ({"seed": -3}, "seed=-3"),
        ({"seed": "7"}, "seed='7'"),
        ({"seed": 2**64}, f"seed={2**64}"),
    ],
)
def test_a_bad_sampling_field_is_refused_by_name(fields: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("+", r"\+")):
        check_request(Request("r", (1, 2), **fields), max_prompt_tokens=8)


def test_the_decoders_own_settings_are_checked(embedded) -> None:
    model, _ = embedded
    bad_fields = (
        ({"top_p": 0}, "top_p=0"),
        ({"top_k": -2}, "top_k=-2"),
        ({"min_p": 1}, "min_p=1"),
        ({"stop": ("</a>",)}, r"stop=\('</a>',\): stop texts need decode="),
        ({"stop": ("",), "decode": str}, "stop=\\(''"),
    )
    for bad, named in bad_fields:
        with pytest.raises(ValueError, match=named):
            Decoder(
                model, slots=1, max_new_tokens=1, max_prompt_tokens=4, eos_id=1, pad_id=0, **bad
            )
