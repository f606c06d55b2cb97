"""Text ↔ token ids through a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library).

The embedded model's tokenizer is one token per character, built offline by
:func:`build_char_tokenizer`; any other model's ``tokenizer.json`` loads the same way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
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
    """Encode prompts, decode responses, and know the end-of-sequence and padding ids.

    ``eos_ids`` are every id that ends a response (chat models stop on more than one, e.g.
    Llama 3's ``<|eot_id|>`` and ``<|end_of_text|>``); ``eos_id`` is the first of them,
    the one to append when writing a response out.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        eos_id: int,
        pad_id: int,
        *,
        eos_ids: Iterable[int] = (),
        bos_id: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.eos_ids = tuple(dict.fromkeys([eos_id, *eos_ids]))  # eos_id first, no repeats
        self.pad_id = pad_id
        self.bos_id = bos_id

    @classmethod
    def from_dir(cls, directory: Path) -> TextCodec:
        """The codec of a Hugging Face model directory: tokenizer.json, with the special
        ids from generation_config.json, config.json and tokenizer_config.json."""
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the model directory has no tokenizer.json")
        tokenizer = Tokenizer.from_file(str(path))
        ids = _SpecialIds(directory, tokenizer)
        eos = ids.every("eos")
        if not eos:
            raise ValueError(
                f"{directory}: no end-of-sequence id (eos_token_id in config.json or "
                "generation_config.json, or eos_token in tokenizer_config.json)"
            )
        pad = ids.first("pad")
        # No padding token (Llama 3 has none): pad with EOS. Padding is masked out of every
        # loss and never attended to, so any id the embedding holds would do.
        pad = eos[0] if pad is None else pad
        return cls(tokenizer, eos[0], pad, eos_ids=eos, bos_id=ids.first("bos"))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, stopping before the first end-of-sequence token if any."""
        ids = list(ids)
        end = next((i for i, token in enumerate(ids) if token in self.eos_ids), len(ids))
        return self.tokenizer.decode(ids[:end], skip_special_tokens=True)


class _SpecialIds:
    """Special token ids as a model directory's three config files give them.

    Ids come first from generation_config.json (what ``generate`` stops on), then
    config.json, then tokenizer_config.json's token strings looked up in the tokenizer.
    """

    _FILES = ("generation_config.json", "config.json")

    def __init__(self, directory: Path, tokenizer: Tokenizer) -> None:
        self.directory, self.tokenizer = directory, tokenizer
        self.configs = [(name, _read_json(directory / name)) for name in self._FILES]
        self.tokens = _read_json(directory / "tokenizer_config.json")

    def every(self, kind: str) -> list[int]:
        """Every id given for ``kind`` (eos, pad, bos), in the order above, once each."""
        found: list[int] = []
        for name, config in self.configs:
            value = config.get(f"{kind}_token_id")
            values = value if isinstance(value, list) else [value]
            if not all(v is None or isinstance(v, int) for v in values):
                raise ValueError(f"{self.directory / name}: {kind}_token_id={value!r} is not an id")
            found += [v for v in values if v is not None]
        token = self._token(kind)
        if token is not None:
            found.append(token)
        return list(dict.fromkeys(found))

    def first(self, kind: str) -> int | None:
        found = self.every(kind)
        return found[0] if found else None

    def _token(self, kind: str) -> int | None:
        token = self.tokens.get(f"{kind}_token")
        if isinstance(token, dict):  # an AddedToken written out
            token = token.get("content")
        if not token:
            return None
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise ValueError(
                f"{self.directory / 'tokenizer_config.json'}: {kind}_token={token!r} is not in "
                "tokenizer.json"
            )
        return found


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
