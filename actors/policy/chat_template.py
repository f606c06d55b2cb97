"""Chat messages → prompt text, by the model directory's own chat template.

The template is ``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``
(the file wins, as in transformers). It renders in a sandbox
(``jinja2.sandbox.ImmutableSandboxedEnvironment``): a template is code that comes with a
downloaded model. The environment is the one transformers' ``apply_chat_template``
gives a template (the same options, filters and globals, the named special tokens as
variables), so the text, encoded without added special tokens, is the same token ids
(tested against transformers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "ChatTemplateError", "find_chat_template"]

# The special tokens transformers passes to a template by name (SPECIAL_TOKENS_ATTRIBUTES).
_NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class ChatTemplateError(ValueError):
    """A model directory without a usable chat template, or messages it cannot render."""


class ChatTemplate:
    """A compiled chat template with the special tokens its directory names."""

    def __init__(self, source: str, special_tokens: Mapping[str, str], origin: str) -> None:
        self.origin = origin  # where the template came from, for error messages
        self.special_tokens = dict(special_tokens)
        try:
            self.template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ChatTemplateError(
                f"{origin}: not a valid template (line {error.lineno}: {error.message})"
            ) from None

    @classmethod
    def from_dir(cls, directory: Path) -> ChatTemplate:
        """The template of a Hugging Face model directory; ChatTemplateError if it has none."""
        found = find_chat_template(directory)
        if found is None:
            raise ChatTemplateError(
                f"{directory}: no chat template (chat_template.jinja, or chat_template in "
                "tokenizer_config.json); chat prompts need one"
            )
        source, origin = found
        return cls(source, _special_tokens(directory), origin)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of ``messages``, by default opening the assistant's turn.
        ``tools``: the function definitions offered (OpenAI's ``tools``), which the
        template renders as its model was trained to read them; None: no tools."""
        # As transformers does: a None-valued key is left out (a Parquet row of messages
        # whose struct has a field only some messages use reads it back as None).
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            return self.template.render(
                messages=chat,
                tools=list(tools) if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"{self.origin}: {type(error).__name__}: {error}") from None


def find_chat_template(directory: Path) -> tuple[str, str] | None:
    """(template source, where it was found) in ``directory``, or None if it has none."""
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8"), str(jinja_file)
    config_file = directory / "tokenizer_config.json"
    config = _read_json(config_file)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the one called "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if isinstance(template, str) and template:
        return template, f"{config_file} chat_template"
    return None


def _special_tokens(directory: Path) -> dict[str, str]:
    config = _read_json(directory / "special_tokens_map.json") | _read_json(
        directory / "tokenizer_config.json"
    )
    tokens = {}
    for name in _NAMED_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):  # an AddedToken written out
            value = value.get("content")
        if isinstance(value, str):
            tokens[name] = value
    return tokens


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``, which training templates use to mark the
    assistant's tokens for transformers: rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's declared class attribute

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson escapes HTML characters, which no chat template wants.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ChatTemplateError(f"{path}: not JSON: {error}") from None
    return value if isinstance(value, dict) else {}
