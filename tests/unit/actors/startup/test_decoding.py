"""A generator's decoders take the run's sampling (training's or validation's) and stop
texts from its config."""

from __future__ import annotations

import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.policy.sampling import Sampling
from asyncrl.actors.startup.decoding import Generation
from asyncrl.runtime.contract.config import config_from_dict


def _generation(overrides: tuple[str, ...]) -> tuple[Generation, torch.nn.Module]:
    """A generator's decoding set-up on the embedded model, and that model."""
    cfg = config_from_dict({}, overrides)
    model, codec = load_model("embedded", torch.float32)
    return Generation(cfg, None, codec, model.config, slots=4, index=None), model


def test_the_training_decoder_samples_and_stops_as_the_run_says() -> None:
    generation, model = _generation(
        (
            "algorithm.temperature=1.5",
            "algorithm.top_p=0.9",
            "algorithm.top_k=8",
            "algorithm.min_p=0.1",
            'algorithm.stop=["+", "="]',
        )
    )
    decoder = generation.decoder(model, version=0)
    assert isinstance(decoder, Decoder)
    assert decoder.sampling == Sampling(1.5, 0.9, 8, 0.1)
    assert decoder.stop_texts is not None and decoder.stop_texts.texts == ("+", "=")
    # The embedded model answers "12+34=" with sums such as "2+4+0=06,...": the first
    # "+" it writes ends the response, with that token.
    prompt = tuple(generation.codec.encode("12+34="))
    decoder.submit([Request("greedy", prompt, greedy=True)])
    finished = []
    while decoder.busy:
        finished += decoder.step()
    text = generation.codec.decode(finished[0].tokens)
    assert text.endswith(("+", "=")) and text.count("+") + text.count("=") == 1
    assert not finished[0].truncated


def test_a_greedy_validation_decoder_keeps_the_stop_texts_and_no_sampling() -> None:
    generation, model = _generation(("algorithm.min_p=0.1", "algorithm.stop=</answer>"))
    decoder = generation.decoder(model, version=0, validation=True)
    assert isinstance(decoder, Decoder)
    assert decoder.sampling == Sampling()
    assert decoder.stop_texts is not None and decoder.stop_texts.texts == ("</answer>",)


def test_a_sampled_validation_decoder_samples_as_data_val_sampling_says() -> None:
    generation, model = _generation(
        (
            "algorithm.temperature=1.5",
            "data.val_sampling.temperature=0.6",
            "data.val_sampling.top_p=0.95",
            "data.val_sampling.top_k=5",
            "data.val_sampling.min_p=0.05",
            "data.val_samples=4",
        )
    )
    decoder = generation.decoder(model, version=3, validation=True)
    assert isinstance(decoder, Decoder)
    assert decoder.sampling == Sampling(0.6, 0.95, 5, 0.05)


def test_a_run_without_stop_texts_has_no_stop_rule() -> None:
    generation, model = _generation(())
    assert generation.decoder(model, version=0).stop_texts is None  # type: ignore[union-attr]
