"""The policy model, its Hugging Face files, and the continuous-batching decoder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model, state_for_saving
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.policy.model import CausalLM, ModelConfig
from asyncrl.actors.policy.scoring import pack, response_logprobs
from asyncrl.actors.policy.tokenizer import TextCodec
from tests.support.models import TINY, tiny_model


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return tiny_model(tmp_path / "model")


def decoder(model: CausalLM, codec: TextCodec, slots: int = 8, seed: int = 0) -> Decoder:
    return Decoder(
        model,
        slots=slots,
        max_new_tokens=12,
        max_prompt_tokens=16,
        eos_id=codec.eos_id,
        pad_id=codec.pad_id,
        seed=seed,
    )


def run_to_end(d: Decoder, between=None) -> list:
    done, steps = [], 0
    while d.busy:
        done += d.step()
        steps += 1
        if between is not None:
            between(steps)
    return sorted(done, key=lambda f: f.tag)


def recomputed(model: CausalLM, codec: TextCodec, finished) -> torch.Tensor:
    packed = pack([list(f.prompt) for f in finished], [f.tokens for f in finished], codec.pad_id)
    with torch.no_grad():
        return response_logprobs(model, packed)


def test_saved_model_loads_in_transformers_with_the_same_logits(model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ours, codec = load_model(str(model_dir))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    ids = torch.tensor([codec.encode("12+345=")])
    assert tokenizer("12+345=", add_special_tokens=False).input_ids == ids[0].tolist()
    with torch.no_grad():
        assert torch.allclose(ours(ids), theirs(ids).logits, atol=1e-5)


def test_the_tokenizer_round_trips_and_stops_at_eos(model_dir: Path) -> None:
    codec = TextCodec.from_dir(model_dir)
    ids = codec.encode("4+5+0=09;9")
    assert codec.decode(ids) == "4+5+0=09;9"
    assert codec.decode([*ids, codec.eos_id, *ids]) == "4+5+0=09;9"


def test_behaviour_logprobs_equal_recomputed_logprobs(model_dir: Path) -> None:
    model, codec = load_model(str(model_dir))
    d = decoder(model, codec, slots=3)  # fewer slots than sequences: slots are reused
    d.submit(Request(i, tuple(codec.encode(p))) for i, p in enumerate(["1+2=", "345+6=", "7="] * 3))
    finished = run_to_end(d)
    assert len(finished) == 9
    again = recomputed(model, codec, finished)
    for row, f in enumerate(finished):
        assert torch.allclose(torch.tensor(f.logprobs), again[row, : len(f.tokens)], atol=1e-4)


def test_a_version_change_mid_sequence_is_carried_by_its_tokens(model_dir: Path) -> None:
    model, codec = load_model(str(model_dir))
    before = {name: t.clone() for name, t in state_for_saving(model).items()}
    torch.manual_seed(1)
    after = {name: t + 0.05 * torch.randn_like(t) for name, t in before.items()}
    d = decoder(model, codec)
    d.max_new_tokens = 12
    d.submit(Request(i, tuple(codec.encode("12+34="))) for i in range(4))
    d.step(), d.step(), d.step()
    d.load(after, version=1)
    finished = run_to_end(d)
    old_model, _ = load_model(str(model_dir))
    for f in finished:
        assert f.versions[:3] == [0, 0, 0] and set(f.versions[3:]) <= {1}
    long = [f for f in finished if len(f.tokens) > 3]
    assert long, "some sequence outlived the version change"
    # Each token's log-prob is its own version's: recompute under each and compare.
    under_old, under_new = recomputed(old_model, codec, long), recomputed(model, codec, long)
    for row, f in enumerate(long):
        for j, version in enumerate(f.versions):
            expected = (under_old if version == 0 else under_new)[row, j]
            assert abs(f.logprobs[j] - expected.item()) < 1e-4


def test_a_finished_slot_is_refilled_at_the_next_step(model_dir: Path) -> None:
    model, codec = load_model(str(model_dir))
    d = decoder(model, codec, slots=2)
    d.submit(Request(i, tuple(codec.encode("1+1="))) for i in range(7))
    while d.busy:
        left = len(d.active) + len(d.waiting)
        finished = d.step()
        decoding = len(d.active) + len(finished)  # the sequences this step advanced
        assert decoding == min(2, left), "a free slot stayed empty while work waited"


def test_greedy_decoding_is_deterministic(model_dir: Path) -> None:
    model, codec = load_model(str(model_dir))
    runs = []
    for seed in (0, 1):
        d = decoder(model, codec, seed=seed)
        d.submit([Request(0, tuple(codec.encode("99+1=")), greedy=True)])
        runs.append(run_to_end(d)[0].tokens)
    assert runs[0] == runs[1]


def test_a_prompt_too_long_is_refused_with_the_limit(model_dir: Path) -> None:
    model, codec = load_model(str(model_dir))
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        decoder(model, codec).submit([Request(0, tuple(range(3, 30)))])


def test_a_model_directory_without_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(str(tmp_path))


def test_an_unsupported_architecture_is_named() -> None:
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        ModelConfig.from_hf({**TINY, "architectures": ["GPT2LMHeadModel"]})
