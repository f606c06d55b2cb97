"""The generate role's decoders take the run's sampling and stop texts from its config."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.policy.sampling import Sampling
from asyncrl.actors.roles.generate import Generate
from asyncrl.runtime.contract.config import config_from_dict


def _role(overrides: tuple[str, ...]) -> Generate:
    """A generate role with what ``_decoder`` reads, on the embedded model."""
    cfg = config_from_dict({}, overrides)
    model, codec = load_model("embedded", torch.float32)
    role = Generate(slots=4)
    role.ctx = SimpleNamespace(config=cfg, index=None)  # type: ignore[assignment]
    role.engine, role.model, role.codec, role.model_config = None, model, codec, model.config
    return role


def test_the_training_decoder_samples_and_stops_as_the_run_says() -> None:
    role = _role(
        (
            "algorithm.temperature=1.5",
            "algorithm.top_p=0.9",
            "algorithm.top_k=8",
            "algorithm.min_p=0.1",
            'algorithm.stop=["+", "="]',
        )
    )
    decoder = role._decoder(role.model, greedy_only=False)
    assert isinstance(decoder, Decoder)
    assert decoder.sampling == Sampling(1.5, 0.9, 8, 0.1)
    assert decoder.stop_texts is not None and decoder.stop_texts.texts == ("+", "=")
    # The embedded model answers "12+34=" with sums such as "2+4+0=06,...": the first
    # "+" it writes ends the response, with that token.
    prompt = tuple(role.codec.encode("12+34="))
    decoder.submit([Request("greedy", prompt, greedy=True)])
    finished = []
    while decoder.busy:
        finished += decoder.step()
    text = role.codec.decode(finished[0].tokens)
    assert text.endswith(("+", "=")) and text.count("+") + text.count("=") == 1
    assert not finished[0].truncated


def test_a_greedy_only_decoder_keeps_the_stop_texts_and_no_sampling() -> None:
    role = _role(("algorithm.min_p=0.1", "algorithm.stop=</answer>"))
    decoder = role._decoder(role.model, greedy_only=True)
    assert isinstance(decoder, Decoder)
    assert decoder.sampling == Sampling()
    assert decoder.stop_texts is not None and decoder.stop_texts.texts == ("</answer>",)


def test_a_run_without_stop_texts_has_no_stop_rule() -> None:
    role = _role(())
    assert role._decoder(role.model, greedy_only=False).stop_texts is None  # type: ignore[union-attr]
