"""Text ↔ token ids through a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library).

The embedded model's tokenizer is one token per character, built offline by
:func:`build_char_tokenizer`; any other model's ``tokenizer.json`` loads the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

__all__ = ["EOS", "PAD", "UNK", "TextCodec", "build_char_tokenizer", "write_tokenizer_files"]

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"


def build_char_tokenizer(alphabet: str) -> Tokenizer:
    """A tokenizer with one token per character of ``alphabet`` (after three specials)."""
    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet {alphabet!r} repeats a character")
    vocab = {token: i for i, token in enumerate([PAD, EOS, UNK, *alphabet])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([PAD, EOS, UNK])
    return tokenizer


def write_tokenizer_files(tokenizer: Tokenizer, directory: Path) -> None:
    """``tokenizer.json`` plus the config that lets ``transformers.AutoTokenizer`` load it."""
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": PAD,
        "eos_token": EOS,
        "unk_token": UNK,
        "model_max_length": 1_000_000,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


class TextCodec:
    """Encode prompts, decode responses, and know the end-of-sequence and padding ids."""

    def __init__(self, tokenizer: Tokenizer, eos_id: int, pad_id: int) -> None:
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.pad_id = pad_id

    @classmethod
    def from_dir(cls, directory: Path) -> TextCodec:
        """The codec of a Hugging Face model directory (tokenizer.json + config.json)."""
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the model directory has no tokenizer.json")
        tokenizer = Tokenizer.from_file(str(path))
        config = json.loads((directory / "config.json").read_text())
        eos = config.get("eos_token_id")
        if isinstance(eos, list):  # some models list several; the first ends a response
            eos = eos[0] if eos else None
        if not isinstance(eos, int):
            raise ValueError(f"{directory / 'config.json'}: eos_token_id is missing")
        pad = config.get("pad_token_id")
        return cls(tokenizer, eos, pad if isinstance(pad, int) else eos)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, stopping before the end-of-sequence token if there is one."""
        ids = list(ids)
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.tokenizer.decode(ids, skip_special_tokens=True)
