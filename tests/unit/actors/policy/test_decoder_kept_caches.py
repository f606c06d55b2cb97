"""Kept caches: a finished sequence that asks for it leaves its keys and values in its free
slot, and a later prompt that starts with its tokens (a conversation's next turn) is fed
only the rest. Reuse must never change a token or a log-probability: every result here is
checked against a decoder that computes everything, or against the model's own forward."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from asyncrl.actors.policy.checkpoint import load_model, state_for_saving
from asyncrl.actors.policy.decoder import Decoder, Finished, Request
from asyncrl.actors.policy.kept_caches import KeptCaches, common_prefix
from asyncrl.actors.policy.model import CausalLM
from asyncrl.actors.policy.sampling import Sampling
from asyncrl.actors.policy.tokenizer import TextCodec
from tests.support.hf_families import hf_model_dir

# The packaged model, trained: its attention is sharp, so a sequence given wrong cache
# entries gets other tokens and log-probs (a random model's barely change).
MODEL = "embedded"
QUESTIONS = ["12+34=", "7+8=", "345+6789=", "99999+1=", "4+56=", "1+2=", "608+5=", "3+3="]
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def embedded() -> tuple[CausalLM, TextCodec]:
    return load_model(MODEL)


def _decoder(model: CausalLM, codec: TextCodec, slots: int = 4, **options) -> Decoder:
    options = {"reuse_min_tokens": 1, "max_new_tokens": 8, "max_prompt_tokens": 100} | options
    return Decoder(model, slots=slots, eos_id=codec.eos_ids, pad_id=codec.pad_id, **options)


def _run(decoder: Decoder, requests: list[Request]) -> dict[object, Finished]:
    decoder.submit(requests)
    done = []
    while decoder.busy:
        done += decoder.step()
    return {f.tag: f for f in done}


def _next_turn(finished: Finished, codec: TextCodec, question: str) -> tuple[int, ...]:
    """The conversation so far, then the next question: a next turn's prompt."""
    return (*finished.prompt, *finished.tokens, *codec.encode(question))


def _assert_same(got: Finished, expected: Finished) -> None:
    assert got.tokens == expected.tokens, f"{got.tag!r}: other tokens than from scratch"
    gap = max(abs(a - b) for a, b in zip(got.logprobs, expected.logprobs, strict=True))
    assert gap < TOLERANCE, f"{got.tag!r}: log-probs differ by {gap}"


@torch.no_grad()
def _assert_logprobs_of(model: CausalLM, finished: Finished, sampling: Sampling) -> None:
    """The log-probs are the model's own of the whole sequence (one forward, no cache)."""
    ids = torch.tensor([[*finished.prompt, *finished.tokens]])
    logprobs = sampling.logprobs(model(ids)[0].float())
    start = len(finished.prompt)
    expected = [logprobs[start + i - 1, t].item() for i, t in enumerate(finished.tokens)]
    gap = max(abs(a - b) for a, b in zip(finished.logprobs, expected, strict=True))
    assert gap < TOLERANCE, f"{finished.tag!r}: log-probs differ from the forward's by {gap}"


@pytest.mark.parametrize("how", ["greedy", "seeded"])
def test_a_next_turn_feeds_only_its_new_tokens_and_samples_what_a_fresh_decoder_does(
    embedded, how: str
) -> None:
    model, codec = embedded
    reusing, fresh = _decoder(model, codec), _decoder(model, codec)
    sampled = {"greedy": True} if how == "greedy" else {"seed": 11}
    prompt = tuple(codec.encode(QUESTIONS[0]))
    turn = _run(reusing, [Request("turn 1", prompt, keep_cache=True, **sampled)])["turn 1"]
    for number, question in enumerate(QUESTIONS[1:4], start=2):
        prompt = _next_turn(turn, codec, question)
        fed_before = reusing.fed_tokens
        tag = f"turn {number}"
        turn = _run(reusing, [Request(tag, prompt, keep_cache=True, **sampled)])[tag]
        alone = _run(fresh, [Request(tag, prompt, **sampled)])[tag]
        _assert_same(turn, alone)
        # Everything before the question is kept but the last token of the turn before,
        # which was sampled and never fed: that token, the question, then each new token
        # but the last are all this turn computes.
        new = len(codec.encode(question)) + 1
        assert turn.cached_tokens == len(prompt) - new and alone.cached_tokens == 0
        assert reusing.fed_tokens - fed_before == new + len(turn.tokens) - 1
    assert reusing.cached_prompt_tokens > reusing.prompt_tokens / 2
    assert fresh.cached_prompt_tokens == 0


def test_only_requests_that_ask_keep_their_cache(embedded) -> None:
    model, codec = embedded
    decoder = _decoder(model, codec)
    prompt = tuple(codec.encode(QUESTIONS[0]))
    first = _run(decoder, [Request("plain", prompt, greedy=True)])["plain"]
    assert len(decoder.kept) == 0
    again = _run(decoder, [Request("next", _next_turn(first, codec, "5+6="), greedy=True)])
    assert again["next"].cached_tokens == 0 and decoder.free_slots == 4


def test_a_prompt_shorter_than_the_minimum_shared_is_computed_whole(embedded) -> None:
    model, codec = embedded
    decoder = _decoder(model, codec, reuse_min_tokens=50)
    first = _run(decoder, [Request("a", (5, 6, 7), greedy=True, keep_cache=True)])["a"]
    nxt = _run(decoder, [Request("b", _next_turn(first, codec, "1+2="), greedy=True)])["b"]
    assert nxt.cached_tokens == 0


def test_the_same_prompt_again_is_fed_its_last_token_and_samples_the_same(embedded) -> None:
    model, codec = embedded
    decoder = _decoder(model, codec)
    prompt = tuple(codec.encode(QUESTIONS[2]))
    first = _run(decoder, [Request(1, prompt, greedy=True, keep_cache=True)])[1]
    again = _run(decoder, [Request(2, prompt, greedy=True, keep_cache=True)])[2]
    assert again.cached_tokens == len(prompt) - 1
    _assert_same(again, first)


def test_more_sessions_than_slots_evict_the_least_recently_used_and_stay_exact(embedded) -> None:
    model, codec = embedded
    reusing, fresh = _decoder(model, codec, slots=3), _decoder(model, codec, slots=3)
    sessions = {s: tuple(codec.encode(q)) for s, q in enumerate(QUESTIONS[:6])}
    turns: dict[int, Finished] = {}
    reused_later: list[int] = []
    for round_ in range(3):
        # Two sessions' turns at a time, in an order that changes each round: the slots
        # (three) cannot hold every session's cache, so some turns find theirs evicted.
        order = list(sessions)[round_ % 2 :: 2] + list(sessions)[(round_ + 1) % 2 :: 2]
        for pair in (order[i : i + 2] for i in range(0, len(order), 2)):
            requests = []
            for s in pair:
                prompt = sessions[s] if s not in turns else _next_turn(turns[s], codec, "1+1=")
                requests.append(Request((s, round_), prompt, greedy=True, keep_cache=True))
            got = _run(reusing, requests)
            alone = _run(fresh, [Request(r.tag, r.prompt, greedy=True) for r in requests])
            for request in requests:
                _assert_same(got[request.tag], alone[request.tag])
                turns[request.tag[0]] = got[request.tag]
                if round_ > 0:
                    reused_later.append(got[request.tag].cached_tokens)
            assert len(reusing.kept) <= 3 and not reusing.kept.slots.keys() & reusing.active.keys()
    assert any(reused_later), "no turn reused a kept cache"
    assert 0 in reused_later, "no kept cache was evicted: the test would not see a bad one"


def test_a_weight_load_drops_every_kept_cache(embedded) -> None:
    model, codec = embedded
    model = copy.deepcopy(model)  # loads change it
    decoder = _decoder(model, codec)
    first = _run(
        decoder, [Request("a", tuple(codec.encode("12+34=")), greedy=True, keep_cache=True)]
    )
    assert len(decoder.kept) == 1
    torch.manual_seed(3)
    new = {n: t + 0.05 * torch.randn_like(t) for n, t in state_for_saving(model).items()}
    decoder.load(new, version=1)
    assert len(decoder.kept) == 0
    prompt = _next_turn(first["a"], codec, "5+6=")
    nxt = _run(decoder, [Request("b", prompt, greedy=True, keep_cache=True)])["b"]
    assert nxt.cached_tokens == 0 and set(nxt.versions) == {1}
    _assert_logprobs_of(model, nxt, Sampling())


def test_sequences_closing_gaps_trade_places_with_kept_caches(embedded) -> None:
    """Sequences of scrambled budgets end in middle slots and are kept there; the ones in
    the last slots move down past them, and every next turn still gets its own cache."""
    model, codec = embedded
    reusing, fresh = _decoder(model, codec, slots=6), _decoder(model, codec, slots=6)
    prompts = [tuple(codec.encode(q)) for q in QUESTIONS[:6]]
    budgets = [2, 9, 3, 12, 1, 6]
    reusing.submit(
        Request(i, p, greedy=True, keep_cache=True, max_new_tokens=b)
        for i, (p, b) in enumerate(zip(prompts, budgets, strict=True))
    )
    finished: dict[int, Finished] = {}
    traded = 0
    while reusing.busy:
        ran_in = {seq.request.tag: slot for slot, seq in reusing.active.items()}
        ended = reusing.step()
        finished.update((f.tag, f) for f in ended)
        kept_in = {tuple(k.tokens.tolist()): slot for slot, k in reusing.kept.slots.items()}
        for f in ended:  # one admitted in this very step took the slot of its number
            traded += kept_in[(*f.prompt, *f.tokens[:-1])] != ran_in.get(f.tag, f.tag)
        assert sorted(reusing.active) == list(range(len(reusing.active)))
        assert not reusing.kept.slots.keys() & reusing.active.keys()
    assert traded > 0, "no kept cache moved: the test would not see a bad trade"
    assert len(reusing.kept) == 6
    nexts = [
        Request(("next", i), _next_turn(finished[i], codec, "2+2="), greedy=True) for i in range(6)
    ]
    got, alone = _run(reusing, nexts), _run(fresh, nexts)
    question = len(codec.encode("2+2="))
    for request in nexts:
        assert got[request.tag].cached_tokens == len(request.prompt) - question - 1
        _assert_same(got[request.tag], alone[request.tag])


def test_a_cancelled_sequence_keeps_nothing_and_the_others_stay_exact(embedded) -> None:
    model, codec = embedded
    decoder = _decoder(model, codec, slots=2)
    first = _run(
        decoder, [Request("a", tuple(codec.encode("12+34=")), greedy=True, keep_cache=True)]
    )
    prompt = _next_turn(first["a"], codec, "5+6=")
    decoder.submit(
        [
            Request("b", prompt, greedy=True, keep_cache=True),
            Request("c", tuple(codec.encode("7+8=")), greedy=True, keep_cache=True),
            Request("waits", tuple(codec.encode("1+2=")), greedy=True, keep_cache=True),
        ]
    )
    decoder.step()
    decoder.cancel(["b", "waits"])
    done = []
    while decoder.busy:
        done += decoder.step()
    assert [f.tag for f in done] == ["c"]
    kept = [k.tokens.tolist() for k in decoder.kept.slots.values()]
    assert kept == [[*done[0].prompt, *done[0].tokens[:-1]]]
    again = _run(decoder, [Request("b again", prompt, greedy=True)])["b again"]
    _assert_logprobs_of(model, again, Sampling())
    decoder.close()  # a decoder dropped keeps nothing either
    assert len(decoder.kept) == 0


def test_a_parallel_choice_of_the_same_turn_reuses_the_same_cache(embedded) -> None:
    """Several requests of one next turn (an API call's n choices) all reuse the turn
    before, whichever of them takes its slot."""
    model, codec = embedded
    decoder = _decoder(model, codec, slots=4)
    first = _run(decoder, [Request("t1", tuple(codec.encode("12+34=")), keep_cache=True, seed=1)])
    prompt = _next_turn(first["t1"], codec, "5+6=")
    choices = [Request(j, prompt, seed=j, keep_cache=True) for j in range(3)]
    got = _run(decoder, choices)
    question = len(codec.encode("5+6="))
    assert [got[j].cached_tokens for j in range(3)] == [len(prompt) - question - 1] * 3
    for j in range(3):
        _assert_logprobs_of(model, got[j], Sampling())


def test_a_reused_prefix_brings_its_recorded_routes(tmp_path) -> None:
    """Router replay: a turn's record of experts covers the tokens it took from the kept
    cache too, as the record of the same conversation decoded at once does."""
    model, _ = load_model(str(hf_model_dir(tmp_path, "qwen3-moe")))
    options = dict(slots=2, max_new_tokens=6, max_prompt_tokens=40, eos_id=1, pad_id=0)
    reusing = Decoder(model, record_routes=True, reuse_min_tokens=1, **options)
    fresh = Decoder(model, record_routes=True, **options)
    prompt = (5, 9, 12, 7, 30, 2)
    first = _run(reusing, [Request("t1", prompt, greedy=True, keep_cache=True)])["t1"]
    conversation = (*prompt, *first.tokens, 11, 4, 8)
    second = _run(reusing, [Request("t2", conversation, greedy=True, keep_cache=True)])["t2"]
    at_once = _run(fresh, [Request("t2", conversation, greedy=True)])["t2"]
    assert second.cached_tokens == len(conversation) - 4
    _assert_same(second, at_once)
    assert second.routes is not None and at_once.routes is not None
    recorded = np.sort(second.routes.astype(np.int64), -1)
    expected = np.sort(at_once.routes.astype(np.int64), -1)
    assert recorded.shape == expected.shape and (recorded == expected).all()


def test_kept_caches_pick_the_longest_shared_prefix_and_evict_the_least_used() -> None:
    kept = KeptCaches(min_tokens=2)
    kept.keep(0, np.array([1, 2, 3, 4]), None)
    kept.keep(1, np.array([1, 2, 9]), None)
    kept.keep(2, np.array([7, 7]), None)
    assert kept.best(np.array([1, 2, 3, 5]), prefer={1}) == (0, 3)
    assert kept.best(np.array([1, 2, 8]), prefer={1}) == (1, 2)  # a tie: the preferred slot
    assert kept.best(np.array([1, 5]), prefer={0}) is None  # below the minimum
    assert kept.least_used() == 0 and kept.least_used(sparing={0}) == 1
    kept.touch(0)
    assert kept.least_used() == 1
    kept.keep(3, np.array([1, 2, 3, 4, 5]), None)  # the same conversation, further
    assert sorted(kept.slots) == [1, 2, 3]
    assert common_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
    with pytest.raises(ValueError, match="reuse_min_tokens=0"):
        KeptCaches(0)


# --- reuse against no reuse, over random sessions ----------------------------------------

# Rounds: some sessions' turns (a session's next, once its last has ended; else its
# first), some steps, then a new version, a cancel or nothing, and maybe steps until every
# sequence has ended (the next round's turns then all go on from the last).
_ROUND = st.tuples(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=3
    ),
    st.integers(0, 8),
    st.sampled_from(["nothing", "load", "cancel"]),
    st.integers(0, 1000),
    st.booleans(),
)
# Three sessions of three turns, their second turns cut by a new version, one cancelled.
_CONVERSATIONS = [
    ([(0, 0, 4), (1, 0, 4), (2, 0, 4)], 0, "nothing", 0, True),
    ([(0, 1, 5), (1, 1, 5), (2, 1, 5)], 2, "load", 7, False),
    ([], 0, "cancel", 4, True),
    ([(0, 2, 6), (1, 2, 6), (2, 2, 6)], 3, "nothing", 0, False),
    ([(1, 3, 6)], 0, "nothing", 0, True),
]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ROUND, min_size=1, max_size=4), st.integers(2, 4), st.booleans())
@example(_CONVERSATIONS, 2, True)
@example(_CONVERSATIONS, 3, False)
def test_a_reusing_decoder_gives_what_a_decoder_without_kept_caches_gives(
    embedded, rounds, slots: int, greedy: bool
) -> None:
    """The same submits, steps, loads and cancels to a decoder whose requests keep their
    caches and to one whose do not: the same tokens, log-probs and versions come out."""
    base, codec = embedded
    reusing = _decoder(copy.deepcopy(base), codec, slots=slots, max_prompt_tokens=90)
    plain = _decoder(copy.deepcopy(base), codec, slots=slots, max_prompt_tokens=90)
    last_turn: dict[int, Finished] = {}  # session → its last turn that ended
    session_of: dict[int, int] = {}  # tag → session
    version = 0

    def step() -> None:
        # Within a step, sequences end in the order their runs were fed, which differs.
        got = sorted(reusing.step(), key=lambda f: f.tag)
        expected = sorted(plain.step(), key=lambda f: f.tag)
        assert [f.tag for f in got] == [f.tag for f in expected]
        for mine, theirs in zip(got, expected, strict=True):
            _assert_same(mine, theirs)
            assert mine.versions == theirs.versions
            last_turn[session_of[mine.tag]] = mine
        assert sorted(reusing.active) == list(range(len(reusing.active)))
        assert not reusing.kept.slots.keys() & reusing.active.keys()
        assert all(slot < slots for slot in reusing.kept.slots)

    def turn(session: int, question: int, budget: int) -> None:
        before = last_turn.get(session)
        if before is None:
            prompt = tuple(codec.encode(QUESTIONS[session + question]))
        else:
            prompt = _next_turn(before, codec, QUESTIONS[question])
        if len(prompt) > 90:
            return
        tag = len(session_of)
        session_of[tag] = session
        # Seeded when not greedy: each draws on its own, whatever batch it shares.
        sampled = {"greedy": True} if greedy else {"seed": tag}
        reusing.submit([Request(tag, prompt, max_new_tokens=budget, keep_cache=True, **sampled)])
        plain.submit([Request(tag, prompt, max_new_tokens=budget, **sampled)])

    for turns, steps, then, seed, settle in rounds:
        for session, question, budget in turns:
            turn(session, question, budget)
        for _ in range(steps):
            step()
        if then == "load":
            generator = torch.Generator().manual_seed(seed)
            state = {
                n: t + 0.02 * torch.randn(t.shape, generator=generator)
                for n, t in state_for_saving(reusing.model).items()
            }
            version += 1
            reusing.load(state, version)
            plain.load(state, version)
            assert len(reusing.kept) == 0
        elif then == "cancel":
            tag = seed % max(1, len(session_of))
            reusing.cancel([tag])
            plain.cancel([tag])
        while settle and (reusing.busy or plain.busy):
            step()
    while reusing.busy or plain.busy:
        step()
    # What one reused, the other computed; nothing else differs.
    assert reusing.fed_tokens + reusing.cached_prompt_tokens == plain.fed_tokens
    assert plain.cached_prompt_tokens == 0
    event("some prompt reused a kept cache" if reusing.cached_prompt_tokens else "none reused")
