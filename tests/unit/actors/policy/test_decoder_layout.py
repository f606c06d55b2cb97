"""How the decoder lays sequences out in its cache: the running ones hold the first slots
with no gaps (an ended sequence's slot goes to the one in the last slot, its cached prefix
with it), and sequences catching up are fed in runs of like length. Neither may change a
log-probability."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.actors.policy import attention_runs as runs_module
from asyncrl.actors.policy.attention_runs import attention_runs
from asyncrl.actors.policy.checkpoint import load_model, state_for_saving
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.policy.model import CausalLM
from asyncrl.actors.policy.padding import like_width_runs
from asyncrl.actors.policy.scoring import pack, response_logprobs
from asyncrl.actors.policy.tokenizer import TextCodec

# The packaged model, trained: its attention is sharp, so a sequence given another's cache
# entries gets other log-probs (a random model's barely change).
MODEL = "embedded"
PROMPTS = ["1+2=", "345+6789=", "7=", "12+3=", "99999+1=", "4+56="]


def _decoder(model: CausalLM, codec: TextCodec, slots: int) -> Decoder:
    return Decoder(
        model,
        slots=slots,
        max_new_tokens=20,
        max_prompt_tokens=16,
        eos_id=codec.eos_id,
        pad_id=codec.pad_id,
    )


def _requests(codec: TextCodec, count: int) -> list[Request]:
    """Prompts of several lengths, with budgets that end them in a scrambled order."""
    return [
        Request(i, tuple(codec.encode(PROMPTS[i % len(PROMPTS)])), max_new_tokens=3 + (7 * i) % 17)
        for i in range(count)
    ]


def _recomputed(model: CausalLM, codec: TextCodec, finished) -> torch.Tensor:
    packed = pack([list(f.prompt) for f in finished], [f.tokens for f in finished], codec.pad_id)
    with torch.no_grad():
        return response_logprobs(model, packed)


def test_running_sequences_hold_the_first_slots_and_keep_their_log_probs() -> None:
    model, codec = load_model(MODEL)
    d = _decoder(model, codec, slots=5)
    d.submit(_requests(codec, 14))
    finished, moved = [], 0
    while d.busy:
        before = {id(seq): slot for slot, seq in d.active.items()}
        finished += d.step()
        after = {id(seq): slot for slot, seq in d.active.items()}
        moved += sum(1 for key, slot in after.items() if key in before and before[key] != slot)
        assert sorted(d.active) == list(range(len(d.active))), "a gap among running slots"
    assert moved > 0, "no sequence changed slots: the test would not see a bad move"
    assert len(finished) == 14
    finished.sort(key=lambda f: f.tag)
    again = _recomputed(model, codec, finished)
    for row, f in enumerate(finished):
        assert torch.allclose(torch.tensor(f.logprobs), again[row, : len(f.tokens)], atol=1e-4)


def test_a_reload_lays_sequences_out_longest_first_and_recomputes_them_exactly() -> None:
    model, codec = load_model(MODEL)
    old_model, _ = load_model(MODEL)
    torch.manual_seed(1)
    after = {n: t + 0.05 * torch.randn_like(t) for n, t in state_for_saving(model).items()}
    d = _decoder(model, codec, slots=8)
    d.submit(_requests(codec, 8))
    finished = d.step() + d.step() + d.step()
    d.load(after, version=1)
    lengths = [len(d.active[slot].tokens) for slot in sorted(d.active)]
    assert lengths == sorted(lengths, reverse=True) and len(set(lengths)) > 1
    assert sorted(d.active) == list(range(len(d.active)))
    while d.busy:
        finished += d.step()
    finished.sort(key=lambda f: f.tag)
    under_old = _recomputed(old_model, codec, finished)
    under_new = _recomputed(model, codec, finished)
    for row, f in enumerate(finished):
        for j, version in enumerate(f.versions):
            expected = (under_old if version == 0 else under_new)[row, j]
            assert abs(f.logprobs[j] - expected.item()) < 1e-4


@given(
    st.lists(st.tuples(st.booleans(), st.integers(1, 300)), min_size=0, max_size=40),
    st.sampled_from([1.0, 1.1, 1.25, 2.0]),
    st.one_of(st.none(), st.integers(1, 2000)),
)
def test_runs_of_like_width_cover_every_row_once_within_the_slack(rows, slack, most) -> None:
    widths = [w for _, w in rows]
    apart = [gap for gap, _ in rows]
    runs = like_width_runs(widths, slack, most=most, apart=apart)
    assert [i for run in runs for i in run] == list(range(len(widths)))
    for run in runs:
        assert not any(apart[i] for i in run[1:]), "a run spans a gap"
        here = [widths[i] for i in run]
        if len(run) > 1:
            assert len(run) * max(here) <= slack * sum(here)
            assert most is None or len(run) * max(here) <= most


def test_rows_of_like_width_share_a_run() -> None:
    assert like_width_runs([10, 11, 12, 200, 210, 220], 1.25) == [range(0, 3), range(3, 6)]


def test_decode_steps_attending_in_runs_keep_every_log_prob(monkeypatch) -> None:
    """With runs free (no cost for a cut), every decode step of sequences of several
    lengths splits its attention; the log-probs are still the model's own."""
    made = []

    def spied(spans, run_cost=None):
        runs = attention_runs(spans, 0)
        made.append(len(runs))
        return runs

    monkeypatch.setattr("asyncrl.actors.policy.model.attention_runs", spied)
    model, codec = load_model(MODEL)
    d = _decoder(model, codec, slots=6)
    d.submit(_requests(codec, 12))
    finished = []
    while d.busy:
        finished += d.step()
    assert max(made) > 2, "no step attended in several runs"
    finished.sort(key=lambda f: f.tag)
    again = _recomputed(model, codec, finished)
    for row, f in enumerate(finished):
        assert torch.allclose(torch.tensor(f.logprobs), again[row, : len(f.tokens)], atol=1e-4)


@given(st.lists(st.integers(1, 400), min_size=1, max_size=80), st.integers(0, 4096))
def test_attention_runs_cover_rows_in_order_and_never_cost_more(spans, run_cost) -> None:
    runs = attention_runs(spans, run_cost)
    assert [r for first, end, _ in runs for r in range(first, end)] == list(range(len(spans)))
    assert len(runs) <= 2**runs_module.MAX_DEPTH
    for first, end, span in runs:
        assert end > first and span == max(spans[first:end])
    cost = sum((end - first) * span for first, end, span in runs) + run_cost * (len(runs) - 1)
    assert cost <= len(spans) * max(spans)


def test_short_rows_after_long_ones_get_their_own_run() -> None:
    spans = [300] * 8 + [20] * 56
    assert attention_runs(spans) == [(0, 8, 300), (8, 64, 20)]
    assert attention_runs([20] * 64) == [(0, 64, 20)]
