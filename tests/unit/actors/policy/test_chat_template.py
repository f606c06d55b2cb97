"""Chat templates (actors/policy/chat_template.py): the same token ids as transformers'
apply_chat_template on the same directory and messages, and errors that name the file."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from asyncrl.actors.policy.chat_template import ChatTemplate, ChatTemplateError
from asyncrl.actors.policy.checkpoint import EMBEDDED_DIR, load_model, save_model
from asyncrl.actors.policy.tokenizer import TextCodec, build_char_tokenizer, write_tokenizer_files

transformers = pytest.importorskip("transformers")

# ChatML as Qwen2.5 writes it: a default system turn, tools as JSON, a namespace, the
# loop controls and raise_exception; everything a real template leans on.
CHATML = """{%- if messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
{%- else -%}{%- set system = 'You are a careful assistant.' -%}{%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system }}
{%- if tools %}{{ '\\n' + tools | tojson }}{% endif %}
{{- '<|im_end|>\\n' }}
{%- set ns = namespace(turns=0) -%}
{%- for message in rest -%}
{%- if message['role'] not in ['user', 'assistant'] -%}
{{ raise_exception('unknown role ' + message['role']) }}
{%- endif -%}
{%- if message['content'] == '' %}{% continue %}{% endif -%}
{%- set ns.turns = ns.turns + 1 -%}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
{%- endfor -%}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
"""

# Llama 2 style: the bos and eos tokens come from the tokenizer config, by name.
LLAMA2 = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}
{% elif message['role'] == 'assistant' %}
{% generation %}{{ ' ' + message['content'] + ' ' + eos_token }}{% endgeneration %}
{% endif %}
{% endfor %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "What is 12+30?"}],
    [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 7*6?"},
        {"role": "assistant", "content": "42"},
        {"role": "user", "content": ""},
        {"role": "user", "content": "And 6*7? Think: {x} & <y>."},
    ],
]


def chat_model_dir(tmp_path: Path, template: str, *, in_file: bool) -> Path:
    """A tokenizer directory (one token per character plus chat markers) with ``template``
    in chat_template.jinja or in tokenizer_config.json."""
    directory = tmp_path / ("file" if in_file else "config")
    directory.mkdir()
    tokenizer = build_char_tokenizer(
        string.ascii_letters + string.digits + " \n.,:?!*+-=&<>{}[]/'\"_"
    )
    tokenizer.add_special_tokens(["<s>", "<|im_start|>", "<|im_end|>"])
    write_tokenizer_files(tokenizer, directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["bos_token"] = "<s>"
    if in_file:
        (directory / "chat_template.jinja").write_text(template)
    else:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def hf_ids(directory: Path, messages: list[dict], **kwargs: object) -> list[int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, **kwargs
    )
    return list(out["input_ids"])


def our_ids(directory: Path, messages: list[dict]) -> list[int]:
    text = ChatTemplate.from_dir(directory).render(messages)
    return TextCodec.from_dir(directory).encode(text)


@pytest.mark.parametrize("template", [CHATML, LLAMA2], ids=["chatml", "llama2"])
@pytest.mark.parametrize("in_file", [True, False], ids=["jinja-file", "tokenizer-config"])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "many-turns"])
def test_token_ids_equal_transformers(
    tmp_path: Path, template: str, in_file: bool, messages: list[dict]
) -> None:
    directory = chat_model_dir(tmp_path, template, in_file=in_file)
    ours = our_ids(directory, messages)
    assert ours == hf_ids(directory, messages)
    assert len(ours) > len(messages[-1]["content"])  # the template did add its markers


def test_the_embedded_model_has_a_template_that_leaves_its_prompts_as_they_are() -> None:
    messages = [{"role": "user", "content": "4589+123="}]
    assert ChatTemplate.from_dir(EMBEDDED_DIR).render(messages) == "4589+123="
    assert our_ids(EMBEDDED_DIR, messages) == hf_ids(EMBEDDED_DIR, messages)
    turns = [
        *messages,
        {"role": "assistant", "content": "4712"},
        {"role": "user", "content": "1+1="},
    ]
    assert our_ids(EMBEDDED_DIR, turns) == hf_ids(EMBEDDED_DIR, turns)


def test_checkpoints_carry_the_chat_template(tmp_path: Path) -> None:
    model, _ = load_model("embedded")
    save_model(model, EMBEDDED_DIR, tmp_path / "ckpt")
    copied = (tmp_path / "ckpt" / "chat_template.jinja").read_text()
    assert copied == (EMBEDDED_DIR / "chat_template.jinja").read_text()


def test_none_valued_keys_are_left_out_as_transformers_does(tmp_path: Path) -> None:
    directory = chat_model_dir(tmp_path, CHATML, in_file=True)
    messages = [{"role": "user", "content": "hi", "name": None}]
    assert our_ids(directory, messages) == hf_ids(directory, messages)


def test_a_directory_without_a_template_is_named(tmp_path: Path) -> None:
    write_tokenizer_files(build_char_tokenizer("ab"), tmp_path)
    with pytest.raises(ChatTemplateError, match=r"no chat template \(chat_template\.jinja"):
        ChatTemplate.from_dir(tmp_path)


def test_a_broken_template_and_a_raising_one_are_named(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match=r"chat_template\.jinja: not a valid template"):
        ChatTemplate.from_dir(tmp_path)
    directory = chat_model_dir(tmp_path, CHATML, in_file=True)
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        ChatTemplate.from_dir(directory).render([{"role": "tool", "content": "x"}])


def test_the_sandbox_refuses_a_template_that_reaches_for_python_internals(tmp_path: Path) -> None:
    (tmp_path / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError, match=r"SecurityError|UndefinedError"):
        ChatTemplate.from_dir(tmp_path).render([{"role": "user", "content": "x"}])
