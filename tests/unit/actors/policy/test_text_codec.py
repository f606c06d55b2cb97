"""Special token ids from a model directory's configs, and stopping on any of several EOS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.policy.tokenizer import TextCodec, build_char_tokenizer
from tests.support.models import tiny_model
from tests.tools.warmup import ALPHABET

END, EOT = "<|end_of_text|>", "<|eot_id|>"


def directory_with(tmp_path: Path, files: dict[str, dict]) -> Path:
    """A char tokenizer with two more special tokens (ids 17, 18), and ``files``."""
    tokenizer = build_char_tokenizer(ALPHABET)
    tokenizer.add_special_tokens([END, EOT])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    for name, content in {"config.json": {}, **files}.items():
        (tmp_path / name).write_text(json.dumps(content))
    return tmp_path


def test_several_eos_ids_and_no_pad_as_in_llama3_instruct(tmp_path: Path) -> None:
    ids = {"bos_token_id": 2, "eos_token_id": [17, 18]}
    codec = TextCodec.from_dir(
        directory_with(tmp_path, {"config.json": ids, "generation_config.json": ids})
    )
    assert codec.eos_ids == (17, 18) and codec.eos_id == 17
    assert codec.pad_id == 17  # no pad token anywhere: EOS pads
    assert codec.bos_id == 2
    text = codec.encode("12+3")
    assert codec.decode([*text, 18, *text]) == "12+3"
    assert codec.decode([*text, 17, *text]) == "12+3"


def test_token_strings_of_tokenizer_config_count_as_qwen_chat_has_them(tmp_path: Path) -> None:
    directory = directory_with(
        tmp_path,
        {
            "config.json": {"eos_token_id": 18},
            "generation_config.json": {"eos_token_id": [18, 17]},
            "tokenizer_config.json": {
                "eos_token": {"content": EOT, "special": True},  # an AddedToken written out
                "pad_token": END,
                "bos_token": None,
            },
        },
    )
    codec = TextCodec.from_dir(directory)
    assert codec.eos_ids == (18, 17) and codec.pad_id == 17 and codec.bos_id is None


def test_no_eos_anywhere_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no end-of-sequence id"):
        TextCodec.from_dir(directory_with(tmp_path, {"config.json": {"pad_token_id": 0}}))


def test_a_token_string_the_tokenizer_lacks_is_named(tmp_path: Path) -> None:
    directory = directory_with(tmp_path, {"tokenizer_config.json": {"eos_token": "<|im_end|>"}})
    with pytest.raises(ValueError, match=r"eos_token='<\|im_end\|>' is not in tokenizer.json"):
        TextCodec.from_dir(directory)


def test_the_decoder_stops_on_any_of_several_eos_ids(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model, codec = load_model(str(tiny_model(tmp_path / "model")))

    def greedy(eos) -> tuple[list[int], bool]:
        d = Decoder(model, slots=1, max_new_tokens=12, max_prompt_tokens=8, eos_id=eos, pad_id=0)
        d.submit([Request(0, tuple(codec.encode("12+34=")), greedy=True)])
        done = []
        while d.busy:
            done += d.step()
        return done[0].tokens, done[0].truncated

    free, _ = greedy(-1)  # an id never sampled: runs to the length limit
    stop = next(t for t in free[1:] if t != codec.eos_id)
    tokens, truncated = greedy((codec.eos_id, stop))
    assert tokens == free[: free.index(stop) + 1] and not truncated
    assert greedy(codec.eos_id) == greedy([codec.eos_id])
