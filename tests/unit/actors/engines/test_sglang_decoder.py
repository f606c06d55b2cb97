"""SGLangDecoder's decoder surface, driven against a fake engine
(:mod:`tests.support.fake_sglang`: the real engine, ``sglang.Engine``, needs a CUDA device
and SGLang's CUDA kernels). ``tests/gpu/test_sglang.py`` runs the real engine where there
is one; the contract every engine meets is in ``test_decoding_contract.py``."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

from asyncrl.actors.engines.sglang.buckets import rebuild
from asyncrl.actors.engines.sglang.engine import SGLangDecoder
from asyncrl.actors.episodes import Episodes
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder, Decoding, Finished, Request
from asyncrl.actors.tasks import Sample
from tests.support.fake_sglang import EOS, FakeSGLangEngine, decoder_over, state


def run_until(decoder: SGLangDecoder, done: Callable[[], bool], timeout_s: float = 20.0):
    results: list[Finished] = []
    deadline = time.monotonic() + timeout_s
    while not done() or decoder.busy:
        results += decoder.step()
        assert time.monotonic() < deadline, "the fake engine did not finish in time"
        if not decoder.busy and done():
            break
    return results


def finish_all(decoder: SGLangDecoder) -> dict[Any, Finished]:
    return {f.tag: f for f in run_until(decoder, lambda: True)}


def test_both_decoders_have_the_surface_the_generate_role_uses() -> None:
    model, _ = load_model("embedded")
    ours = Decoder(model, slots=1, max_new_tokens=1, max_prompt_tokens=4, eos_id=1, pad_id=0)
    assert isinstance(ours, Decoding)
    sglang = decoder_over(FakeSGLangEngine())
    assert isinstance(sglang, Decoding)
    sglang.runner.close()


def test_responses_stop_at_eos_or_their_budget_with_a_fake_sglang_engine() -> None:
    """The real engine needs a GPU; this fake streams as it does."""
    engine = FakeSGLangEngine()
    decoder = decoder_over(engine)
    decoder.submit([Request("eos", (90, 95)), Request("short", (3,), max_new_tokens=3)])
    assert decoder.busy and decoder.free_slots == 6
    results = finish_all(decoder)
    assert results["eos"].tokens == [96, 97, 98, 99]
    assert results["eos"].stopped_by == EOS and not results["eos"].truncated
    assert results["short"].tokens == [4, 5, 6] and results["short"].truncated
    assert results["short"].stopped_by is None
    for finished in results.values():
        assert finished.versions == [0] * len(finished.tokens)
        assert finished.logprobs == [0.0] * len(finished.tokens)
    assert not decoder.busy and decoder.free_slots == 8
    params = {rid: p for rid, _, p in engine.submitted}
    assert all(p["no_stop_trim"] and EOS in p["stop_token_ids"] for p in params.values())
    decoder.runner.close()
    assert engine.shut


def test_stop_ids_stop_when_and_greedy_are_honoured_with_a_fake_sglang_engine() -> None:
    """The real engine needs a GPU; this fake streams as it does."""
    engine = FakeSGLangEngine()
    decoder = decoder_over(engine, temperature=0.7)
    decoder.submit(
        [
            Request("tool", (10,), stop_ids=frozenset({13})),
            Request("text", (20,), stop_when=lambda response: sum(response) > 40),
            Request("greedy", (30,), greedy=True, max_new_tokens=2),
        ]
    )
    results = finish_all(decoder)
    assert results["tool"].tokens == [11, 12, 13] and results["tool"].stopped_by == 13
    assert results["text"].tokens == [21, 22] and results["text"].stopped_by == 22
    temperatures = sorted(p["temperature"] for _, _, p in engine.submitted)
    assert temperatures == [0.0, 0.7, 0.7]
    decoder.runner.close()


def test_each_requests_sampling_reaches_sglang_the_decoders_where_it_names_none() -> None:
    """The real engine needs a GPU; this fake records what it was asked."""
    engine = FakeSGLangEngine()
    decoder = decoder_over(
        engine, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, stop=("x",), decode=str
    )
    decoder.submit(
        [
            Request("own", (10,)),
            Request("named", (20,), temperature=1.3, top_p=0.5, top_k=0, min_p=0.2, seed=7),
            Request("greedy", (30,), greedy=True, top_k=5),
        ]
    )
    finish_all(decoder)
    by_prompt = {tuple(ids): p for _, ids, p in engine.submitted}
    own, named, greedy = by_prompt[(10,)], by_prompt[(20,)], by_prompt[(30,)]
    assert (own["temperature"], own["top_p"], own["top_k"], own["min_p"]) == (0.7, 0.9, 20, 0.05)
    assert "sampling_seed" not in own
    assert (named["temperature"], named["top_p"], named["top_k"]) == (1.3, 0.5, -1)
    assert named["min_p"] == 0.2 and named["sampling_seed"] == 7
    assert greedy["temperature"] == 0.0 and "top_k" not in greedy and "min_p" not in greedy
    # Stop texts are found on our codec's text, not by the engine (it has no tokenizer).
    assert not any("stop" in params for _, _, params in engine.submitted)
    decoder.runner.close()


def test_a_load_mid_request_tags_every_token_with_its_version_with_a_fake_sglang_engine() -> None:
    """The real engine needs a GPU; this fake pauses, loads and continues as it does."""
    engine = FakeSGLangEngine()
    decoder = decoder_over(engine, max_new_tokens=400, eos_id=10_000)
    decoder.submit([Request("long", (1,)), Request("other", (2,), max_new_tokens=300)])
    results: dict[Any, Finished] = {}
    for version, after in [(1, 30), (2, 60)]:
        while engine.produced < after:
            results |= {f.tag: f for f in decoder.step()}
        assert decoder.load(state(float(version)), version, copy=False) == []
        assert decoder.version == version
    results |= finish_all(decoder)
    assert engine.calls == ["pause", "update", "update", "continue"] * 2
    for finished in results.values():
        versions = finished.versions
        assert versions == sorted(versions) and set(versions) == {0, 1, 2}
        # Each token's log-prob came from the weights its tag names.
        assert finished.logprobs == [-float(v) for v in versions]
    assert len(results["long"].tokens) == 400 and results["long"].truncated
    decoder.runner.close()


def test_weights_go_in_as_flattened_buckets_flushed_once_with_a_fake_sglang_engine() -> None:
    """The real engine needs a GPU; this fake takes buckets as it does."""
    engine = FakeSGLangEngine()
    decoder = decoder_over(engine)
    decoder.load(state(3.0), 7)
    sent = [bucket for bucket, _, _ in engine.updates]
    assert {bucket.flat.dtype for bucket in sent} == {torch.float32, torch.bfloat16}
    assert [last for _, _, last in engine.updates] == [False, True]
    assert {version for _, version, _ in engine.updates} == {7}
    rebuilt = rebuild(sent, tied_embeddings=False)
    assert all(torch.equal(rebuilt[n], t) for n, t in state(3.0).items())
    decoder.runner.close()


def test_an_engine_that_aborts_on_pause_continues_partial_rollouts_with_a_fake_sglang_engine():
    """The real engine needs a GPU; this fake aborts in-flight requests on a pause, as
    SGLang's "abort" pause does, and the decoder resubmits them as prompt + prefix."""
    engine = FakeSGLangEngine(pause_aborts=True)
    decoder = decoder_over(engine, max_new_tokens=60)
    decoder.submit([Request("a", (1, 2))])
    while engine.produced < 10:
        decoder.step()
    decoder.load(state(1.0), 1)
    finished = finish_all(decoder)["a"]
    assert len(engine.submitted) == 2
    (_, first, _), (_, second, params) = engine.submitted
    assert first == [1, 2]
    prefix = second[2:]
    assert second[:2] == [1, 2] and prefix == finished.tokens[: len(prefix)]
    assert params["max_new_tokens"] == 60 - len(prefix)
    assert len(finished.tokens) == 60 and finished.tokens == list(range(3, 63))
    assert finished.versions == [0] * len(prefix) + [1] * (60 - len(prefix))
    assert finished.logprobs == [-float(v) for v in finished.versions]
    decoder.runner.close()


def test_cancelled_requests_are_aborted_and_never_returned_with_a_fake_sglang_engine() -> None:
    """The real engine needs a GPU; this fake aborts as it does."""
    engine = FakeSGLangEngine(token_s=0.002)
    decoder = decoder_over(engine, max_new_tokens=300)
    decoder.submit([Request("gone", (1,)), Request("kept", (50,), max_new_tokens=5)])
    while engine.produced < 4:
        decoder.step()
    decoder.cancel(["gone", "unknown"])
    assert decoder.free_slots == 7
    results = finish_all(decoder)
    assert set(results) == {"kept"}
    deadline = time.monotonic() + 5
    while not engine.aborted and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.aborted
    decoder.close()
    decoder.runner.close()


def test_two_decoders_share_one_engine_and_its_version_with_a_fake_sglang_engine() -> None:
    """Validation's decoder shares the training one's engine (which needs a GPU)."""
    engine = FakeSGLangEngine()
    training = decoder_over(engine)
    validation = SGLangDecoder(
        training.runner, slots=4, max_new_tokens=3, max_prompt_tokens=16, eos_id=EOS
    )
    training.submit([Request(0, (1,), max_new_tokens=2)])
    validation.submit([Request(0, (5,), greedy=True)])
    assert finish_all(training)[0].tokens == [2, 3]
    assert finish_all(validation)[0].tokens == [6, 7, 8]
    training.load(state(1.0), 1)
    assert validation.version == 1
    training.runner.close()


def test_episodes_run_on_the_sglang_decoder_with_a_fake_sglang_engine() -> None:
    """The generate role's episodes drive this decoder as the PyTorch one (the real engine
    needs a GPU)."""
    engine = FakeSGLangEngine()
    decoder = decoder_over(engine, max_new_tokens=4)
    episodes = Episodes(decoder, codec=None)  # type: ignore[arg-type]  # no environment
    for j in range(3):
        episodes.begin(j, Sample(prompt="", answer=""), (10 * (j + 1),))
    done = []
    deadline = time.monotonic() + 20
    while episodes.busy:
        finished, failed = episodes.step()
        assert not failed
        done += finished
        assert time.monotonic() < deadline
    turns = sorted(e.last_turn for e in done)
    assert turns == [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]]
    assert all(e.trained == [False] + [True] * 4 for e in done)
    decoder.runner.close()


def test_a_prompt_out_of_range_is_refused_at_submit_with_a_fake_sglang_engine() -> None:
    """The real engine needs a GPU; the checks happen before it is asked."""
    decoder = decoder_over(FakeSGLangEngine())
    with pytest.raises(ValueError, match="prompt of 17 tokens"):
        decoder.submit([Request("x", tuple(range(17)))])
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        decoder.submit([Request("x", (1,), max_new_tokens=0)])
    with pytest.raises(ValueError, match="temperature"):
        SGLangDecoder(
            decoder.runner, slots=1, max_new_tokens=1, max_prompt_tokens=1, eos_id=1, temperature=0
        )
    decoder.runner.close()


# --- SGLangEngine, the glue to sglang.Engine, against fake sglang modules ---------------------


class _Recorded:
    """An SGLang request object: keeps the keyword arguments it was made with."""

    def __init__(self, **fields: Any) -> None:
        self.fields = fields


class _FakeTokenizerManager:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.calls.append(("abort", rid))

    async def pause_generation(self, request: _Recorded) -> None:
        self.calls.append(("pause", request.fields))

    async def continue_generation(self, request: _Recorded) -> None:
        self.calls.append(("continue", request.fields))

    async def update_weights_from_tensor(self, request: _Recorded, _http: None):
        self.calls.append(("update", request.fields))
        return True, "Success"


class _FakeEngine:
    """Stands in for sglang.Engine (which needs a GPU): records how it is called."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        _FakeEngine.made.append(kwargs)
        self.loop = asyncio.new_event_loop()
        self.tokenizer_manager = _FakeTokenizerManager()
        self.generated: list[dict[str, Any]] = []
        self.shut = False

    async def async_generate(self, **kwargs: Any):
        self.generated.append(kwargs)

        async def stream():
            done = {"type": "length", "length": 2}
            both = [(-0.5, 7, None), (-0.25, 8, None)]
            yield {"meta_info": {"output_token_logprobs": both[:1]}}
            yield {"meta_info": {"output_token_logprobs": both}}
            yield {"meta_info": {"output_token_logprobs": both, "finish_reason": done}}

        return stream()

    def shutdown(self) -> None:
        self.shut = True


@pytest.fixture
def fake_sglang(monkeypatch) -> type[_FakeEngine]:
    import dataclasses
    import types

    @dataclasses.dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: torch.Size
        dtype: torch.dtype
        start_idx: int
        end_idx: int
        numel: int

    class MultiprocessingSerializer:
        @staticmethod
        def serialize(obj: Any, output_str: bool = False) -> Any:
            assert output_str
            return ("serialized", obj)

    modules = {
        "sglang": {"Engine": _FakeEngine},
        "sglang.srt": {},
        "sglang.srt.managers": {},
        "sglang.srt.managers.io_struct": {
            "PauseGenerationReqInput": _Recorded,
            "ContinueGenerationReqInput": _Recorded,
            "UpdateWeightsFromTensorReqInput": _Recorded,
        },
        "sglang.srt.utils": {"MultiprocessingSerializer": MultiprocessingSerializer},
        "sglang.srt.weight_sync": {},
        "sglang.srt.weight_sync.tensor_bucket": {
            "FlattenedTensorMetadata": FlattenedTensorMetadata
        },
    }
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    _FakeEngine.made.clear()
    return _FakeEngine


def test_the_glue_drives_sglang_engine_as_its_api_says_with_a_fake_sglang_engine(
    fake_sglang: type[_FakeEngine],
) -> None:
    """sglang.Engine needs a GPU: fake sglang modules record what the glue asks of it."""
    from asyncrl.actors.engines.sglang.engine import start_engine

    runner = start_engine(
        "/models/m",
        device=torch.device("cpu"),
        dtype="bfloat16",
        context_length=64,
        seed=3,
        version=0,
        bucket_mb=1,
        tied_embeddings=True,
        mem_fraction=0.5,
    )
    (made,) = fake_sglang.made
    assert made["model_path"] == "/models/m" and made["skip_tokenizer_init"] is True
    assert made["mem_fraction_static"] == 0.5 and made["random_seed"] == 3
    engine = runner.engine.engine
    assert runner.loop is engine.loop  # requests run on the loop the engine was made on
    decoder = SGLangDecoder(runner, slots=2, max_new_tokens=2, max_prompt_tokens=8, eos_id=1)
    decoder.submit([Request("a", (5, 6))])
    finished = finish_all(decoder)["a"]
    assert finished.tokens == [7, 8] and finished.logprobs == [-0.5, -0.25]
    assert finished.truncated
    (asked,) = engine.generated
    assert asked["input_ids"] == [5, 6] and asked["return_logprob"] and asked["stream"]
    weights = {
        "model.embed_tokens.weight": torch.ones(4, 2),
        "lm_head.weight": torch.ones(4, 2),
        "model.norm.weight": torch.ones(2, dtype=torch.float32),
    }
    decoder.load(weights, 1)
    calls = engine.tokenizer_manager.calls
    assert [kind for kind, _ in calls] == ["pause", "update", "continue"]
    assert calls[0][1] == {"mode": "retract"}
    update = calls[1][1]
    assert update["load_format"] == "flattened_bucket" and update["flush_cache"]
    assert update["weight_version"] == "1"
    ((tag, payload),) = update["serialized_named_tensors"]
    assert tag == "serialized"
    assert [m.name for m in payload["metadata"]] == [
        "model.embed_tokens.weight",
        "model.norm.weight",
    ]
    assert payload["flattened_tensor"].numel() == 10
    runner.close()
    assert engine.shut
