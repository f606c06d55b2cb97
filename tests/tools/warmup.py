"""Make the embedded base models: a short, seeded supervised warm-up on an embedded task.

    python -m tests.tools.warmup [--out DIR] [--seed 0] [--steps 1000]
    python -m tests.tools.warmup --task asyncrl.actors.tasks.calculator:task \
        --out actors/policy/embedded_calculator --slip 0.85
    python -m tests.tools.warmup --task asyncrl.actors.tasks.arithmetic:long_task \
        --out actors/policy/embedded_long --init embedded --positions 384 \
        --max-new-tokens 320 --steps 400 --batch 32 --lr 1e-3
    python -m tests.tools.warmup --task asyncrl.actors.tasks.code:task \
        --out actors/policy/embedded_code --steps 600 --max-new-tokens 16
    python -m tests.tools.warmup --agent --init embedded-calculator \
        --out actors/policy/embedded_agent --slip 0.65 --steps 500 --batch 32

The calculator model (``model.path: embedded-calculator``) learns from tool-use
trajectories (:mod:`asyncrl.actors.tasks.calculator`) whose habits are mostly bad:
``--slip`` of them call the calculator on the product alone (four in five of those) or
guess without it; it is scored by playing whole episodes against the calculator. The
calculator's answers are in the demonstrations but not trained on, as in RL. The
shipped model: validation reward 0.35 on 128 prompts (greedy: the whole expression into
the calculator on 14 of the 97 problems that need it, the product alone on the rest).

The code model (``model.path: embedded-code``) learns to write a function's body from
three examples of it (:mod:`asyncrl.actors.tasks.code`); ``--slip`` of the
demonstrations (75%) write the function's usual slip instead (``a*b+b`` for ``a*b+a``,
``min`` for ``max``). It is scored by running its programs in the sandbox, so the
warm-up needs a machine that can give one. The shipped model (600 steps of 64, 2 min 52 s
of CPU on the loaded 2-core machine, 2026-11-29): validation reward 0.19 on 128 prompts;
greedy, it wrote the reference on 13, the slip on 70, another function on 45
(``python -m tests.tools.code_responses``).
The agent model (``model.path: embedded-agent``, ``--agent``) plays the same calculator
through a chat template with Hermes-style tool calls (:data:`AGENT_CHAT_TEMPLATE`): the
roles and the fixed JSON around a call's expression are added tokens of the vocabulary,
so ``<tool_call>{"name": "calculator", "arguments": {"expression": "34*56+12"}}
</tool_call>`` costs four tokens besides the expression's characters. It starts from the
calculator model's weights (the same 32 ids; the added tokens take the free ones) and
learns conversations rendered by its template with the same bad habits, the tool's
answers out of the loss; a few of the good ones chain two calls (the product, then its
value with the rest). It is scored by playing greedy episodes in the chat format.
Where greedy decoding lands is steep in ``--slip`` (500 steps of 32: 0.75 gave
validation reward 0.23, the product alone on 95 of the 97 sums; 0.70 0.25; 0.60 0.52).
The shipped model (``--slip 0.65``, 10 minutes on the loaded 2-core machine):
validation reward 0.41 on 128 prompts (the whole expression into the calculator on 25
of the 97 sums, two calls on one, the product alone on the rest).

Trains a small Llama-architecture model from scratch on written-out solutions of the
arithmetic task. The demonstrations mix two habits, as a pretrained model's would: most
(``--slip``, 75%) forget to carry, the rest add correctly. The model learns both, and
greedy decoding follows the majority, so it is right only on sums without a carry
(validation reward 0.44 on 128 prompts): rewarded sometimes, with room to learn. RL's
job is to find out, from the reward alone, that carrying pays. The warm-up draws the
number of columns uniformly, so the model has seen enough long sums to do them.

The long model (``model.path: embedded-long``, for sums of up to 30 digits) starts from the
embedded one (``--init``: rotary positions, so the same weights take 384 positions) and
learns the longer sums with the same 75% slip. Trained from scratch instead, 1,000 steps
of 32 (26 minutes here) left a model that could not yet line the digits up, whose
greedy responses ran about 180 tokens even for short sums (validation reward 0.03). The
shipped model: 400 steps of 32 (15 minutes on a loaded 2-core machine), validation
reward 0.20 on 128 prompts of the long-tail draw: right on short sums without a carry,
long sums written out at about their length but with digits miscopied (none right from
5 digits up).

Everything is seeded and runs on one CPU thread, so a rerun makes a model of the same
kind, though not bit for bit the same one: CPU kernels round according to memory layout,
which an extra validation pass or a change in the attention code shifts. (The shipped
model: validation reward 0.44; a rerun with the current code: 0.46.) The result is
a Hugging Face model directory (config.json, model.safetensors, tokenizer.json) that
``transformers.AutoModelForCausalLM`` loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer

from asyncrl.actors.episodes import EpisodeLimits, Episodes
from asyncrl.actors.policy.chat_template import ChatTemplate
from asyncrl.actors.policy.checkpoint import EMBEDDED_DIR, load_model, load_state, save_model
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.policy.model import CausalLM, ModelConfig
from asyncrl.actors.policy.scoring import Packed, pack, response_logprobs
from asyncrl.actors.policy.tokenizer import (
    EOS,
    PAD,
    TextCodec,
    build_char_tokenizer,
    write_tokenizer_files,
)
from asyncrl.actors.tasks import Sample, Task, calculator, load_task
from asyncrl.actors.tasks import calculator_tools_harness as tools_harness
from asyncrl.actors.tasks import code as code_task
from asyncrl.actors.tasks.arithmetic import Arithmetic

__all__ = [
    "AGENT_CHAT_TEMPLATE",
    "ALPHABET",
    "BASE_CONFIG",
    "agent_conversation",
    "agent_demonstrations",
    "agent_episodes",
    "agent_reward",
    "agent_tokenizer",
    "calculator_demonstrations",
    "calculator_reward",
    "code_demonstrations",
    "main",
    "validation_reward",
]

ALPHABET = "0123456789+=,;"
BASE_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 32,
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
_SFT_OFFSET = 10**9  # warm-up samples come from far beyond where the RL dataloader reads


def validation_reward(
    model: CausalLM,
    codec: TextCodec,
    task: Task,
    prompts: int,
    *,
    max_new_tokens: int = 96,
    slots: int = 64,
) -> float:
    """Mean reward of greedy responses to the first ``prompts`` validation samples."""
    samples = [task.sample("validation", i) for i in range(prompts)]
    encoded = [tuple(codec.encode(s.prompt)) for s in samples]
    decoder = Decoder(
        model,
        slots=slots,
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=max(len(e) for e in encoded),
        eos_id=codec.eos_ids,
        pad_id=codec.pad_id,
    )
    decoder.submit(Request(i, e, greedy=True) for i, e in enumerate(encoded))
    total = 0.0
    while decoder.busy:
        for done in decoder.step():
            total += task.reward(samples[done.tag], codec.decode(done.tokens))
    model.train()
    return total / prompts


def calculator_reward(model: CausalLM, codec: TextCodec, prompts: int, *, slots: int = 64) -> float:
    """Mean reward of greedy calculator episodes on the first ``prompts`` validation samples."""
    decoder = Decoder(
        model,
        slots=slots,
        max_new_tokens=16,
        max_prompt_tokens=48,
        eos_id=codec.eos_ids,
        pad_id=codec.pad_id,
    )
    episodes = Episodes(
        decoder,
        codec,
        environment=calculator.Calculator,
        name="calculator",
        limits=EpisodeLimits(max_turns=3, max_total_tokens=64, step_timeout_s=0.0),
        stop_ids=codec.encode("]"),
    )
    for i in range(prompts):
        episodes.begin(i, calculator.task.sample("validation", i), (), greedy=True)
    total = 0.0
    while episodes.busy:
        done, failed = episodes.step()
        assert not failed, failed
        total += sum(e.reward or 0.0 for e in done)
    model.train()
    return total / prompts


def calculator_demonstrations(codec: TextCodec, start: int, size: int, slip: float, seed: int):
    prompts, responses, trained = [], [], []
    for i in range(_SFT_OFFSET + start, _SFT_OFFSET + start + size):
        sample = calculator.task.sample("train", i)
        draw = random.Random(seed * 1_000_003 + i).random()
        habit = "full" if draw >= slip else "product" if draw < 0.8 * slip else "guess"
        tokens, mask = [], []
        for text, is_model in calculator.task.demonstration(sample, habit):
            encoded = codec.encode(text)
            tokens += encoded
            mask += [is_model] * len(encoded)
        prompts.append(codec.encode(sample.prompt))
        responses.append([*tokens, codec.eos_id])
        trained.append([*mask, True])
    return pack(prompts, responses, codec.pad_id, trained)


def code_demonstrations(
    task: code_task.CodeTask, codec: TextCodec, start: int, size: int, slip: float, seed: int
):
    """Function bodies for the code task's prompts, ``slip`` of them with the function's
    usual slip (one operator or name wrong)."""
    indices = range(_SFT_OFFSET + start, _SFT_OFFSET + start + size)
    samples = [task.sample("train", i) for i in indices]
    slips = [random.Random(seed * 1_000_003 + i).random() < slip for i in indices]
    prompts = [codec.encode(s.prompt) for s in samples]
    responses = [
        [*codec.encode(task.demonstration(s, slip=slipped)), codec.eos_id]
        for s, slipped in zip(samples, slips, strict=True)
    ]
    return pack(prompts, responses, codec.pad_id)


def _batch(task: Arithmetic, codec: TextCodec, start: int, size: int, slip: float, seed: int):
    indices = range(_SFT_OFFSET + start, _SFT_OFFSET + start + size)
    samples = [task.sample("train", i) for i in indices]
    slips = [random.Random(seed * 1_000_003 + i).random() < slip for i in indices]
    prompts = [codec.encode(s.prompt) for s in samples]
    responses = [
        [*codec.encode(task.reference(s, carry=not slipped)), codec.eos_id]
        for s, slipped in zip(samples, slips, strict=True)
    ]
    return pack(prompts, responses, codec.pad_id)


# --- the agent model: the calculator in the chat format, Hermes-style tool calls -------

# Added to the calculator's 21 ids (as 21..28): the roles (special: never text) and the
# tool call's fixed parts (text: a call decodes to real Hermes JSON).
AGENT_ROLE_TOKENS = ("<|tools|>", "<|user|>", "<|assistant|>", "<|tool|>")
_CALL_OPEN = '{"name": "calculator", "arguments": {"expression": "'
_CALL_CLOSE = '"}}'
AGENT_CALL_TOKENS = ("<tool_call>", "</tool_call>", _CALL_OPEN, _CALL_CLOSE)
AGENT_CHAT_TEMPLATE = """\
{#- embedded-agent's chat format (made by tests/tools/warmup.py). The vocabulary is digits,
    + - * = [ ] ; ? and the markers below: it cannot spell a tool's schema, so the tools
    offered render as one marker, <|tools|>; the model knows one tool, the calculator.
    A tool call is Hermes's, <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
    whose fixed JSON around the expression is two tokens of the vocabulary. Arguments
    given as an object are written by tojson, as JSON text as they are. The assistant's
    turn ends with the end-of-sequence token; user and tool turns end where the next
    role's marker starts. -#}
{%- if tools -%}<|tools|>{%- endif -%}
{%- for message in messages -%}
{%- if message.role == "user" -%}
<|user|>{{ message.content }}
{%- elif message.role == "assistant" -%}
<|assistant|>{{ message.content or "" }}
{%- for tool_call in message.tool_calls or [] -%}
{%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
{%- if call.arguments is string -%}
<tool_call>{"name": {{ call.name | tojson }}, "arguments": {{ call.arguments }}}</tool_call>
{%- else -%}
<tool_call>{{ {"name": call.name, "arguments": call.arguments} | tojson }}</tool_call>
{%- endif -%}
{%- endfor -%}
{{ eos_token }}
{%- elif message.role == "tool" -%}
<|tool|>{{ message.content }}
{%- else -%}
{{ raise_exception("embedded-agent reads user, assistant and tool messages, not " ~ message.role) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}
"""
_AGENT_TOOLS = [tools_harness.CALCULATOR_TOOL]
_AGENT_PROMPT_TOKENS = 104  # the longest conversation before a reply (4 replies of 16)
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def agent_tokenizer() -> Tokenizer:
    """The calculator's characters plus the chat roles and the tool call's fixed parts."""
    tokenizer = build_char_tokenizer(calculator.ALPHABET)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in AGENT_ROLE_TOKENS]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in AGENT_CALL_TOKENS]
    )
    return tokenizer


def agent_conversation(sample: Sample, habit: str) -> list[dict]:
    """The chat messages of an episode played with ``habit``: ``full`` calls the tool on
    the whole expression, ``chain`` on the product, then on its value with the rest,
    ``product`` on the product alone and answers its value, ``guess`` answers without the
    tool (a number of about the right size)."""
    expression = sample.prompt.rstrip("=")
    messages: list[dict] = [{"role": "user", "content": sample.prompt}]
    if habit == "guess":
        rng = random.Random(expression)
        answer = str(rng.randint(1, 10 ** len(sample.answer)))
        return [*messages, {"role": "assistant", "content": answer}]
    product = re.match(r"\d+\*\d+", expression)[0]
    calls = [expression] if habit == "full" else [product]
    if habit == "chain" and product != expression:
        calls.append(f"{calculator.evaluate(product)}{expression[len(product) :]}")
    for n, called in enumerate(calls):
        call = {"name": "calculator", "arguments": {"expression": called}}
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{n}", "type": "function", "function": call}
            ]}
        )  # fmt: skip
        value = tools_harness.tool_answer("calculator", json.dumps(call["arguments"]))
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": value})
    return [*messages, {"role": "assistant", "content": messages[-1]["content"]}]


def agent_tokens(
    codec: TextCodec, template: ChatTemplate, messages: list[dict]
) -> tuple[list[int], list[int], list[bool]]:
    """(prompt ids, the rest's ids, which of the rest the model wrote): each message's
    tokens are what the template renders for it after the ones before (the ids of the
    whole conversation, since no token spans two messages)."""
    prompt = template.render(messages[:1], tools=_AGENT_TOOLS)
    ids, trained, rendered = [], [], prompt
    for n in range(1, len(messages)):
        assistant = messages[n]["role"] == "assistant"
        # The assistant's turn after its generation prompt; the others with the next one.
        text = template.render(
            messages[: n + 1], tools=_AGENT_TOOLS, add_generation_prompt=not assistant
        )
        new = codec.encode(text[len(rendered) :])
        ids += new
        trained += [assistant] * len(new)
        rendered = text
    return codec.encode(prompt), ids, trained


def agent_demonstrations(
    codec: TextCodec, template: ChatTemplate, start: int, size: int, slip: float, seed: int
):
    """A batch of conversations with the calculator's habits: ``slip`` of them bad (four
    in five the product alone, the rest a guess), of the good ones a third chaining."""
    prompts, responses, trained = [], [], []
    for i in range(_SFT_OFFSET + start, _SFT_OFFSET + start + size):
        sample = calculator.task.sample("train", i)
        draw = random.Random(seed * 1_000_003 + i).random()
        if draw < slip:
            habit = "product" if draw < 0.8 * slip else "guess"
        else:
            habit = "chain" if draw < slip + (1 - slip) / 3 else "full"
        prompt, rest, mask = agent_tokens(codec, template, agent_conversation(sample, habit))
        prompts.append(prompt)
        responses.append(rest)
        trained.append(mask)
    return pack(prompts, responses, codec.pad_id, trained)


def agent_reward(
    model: CausalLM, codec: TextCodec, template: ChatTemplate, prompts: int, *, slots: int = 64
) -> float:
    """Mean reward of greedy episodes in the chat format on the first ``prompts``
    validation samples (:func:`agent_episodes`)."""
    episodes = agent_episodes(model, codec, template, prompts, slots=slots)
    return sum(reward for _, reward in episodes) / prompts


def agent_episodes(
    model: CausalLM, codec: TextCodec, template: ChatTemplate, prompts: int, *, slots: int = 64
) -> list[tuple[list[dict], float]]:
    """Greedy episodes on the first ``prompts`` validation samples, played as the
    tool-calling harness plays them: each reply continues the token ids so far, a tool
    call is answered by a tool message. Per episode its messages and reward."""
    decoder = Decoder(
        model,
        slots=slots,
        max_new_tokens=tools_harness.TURN_TOKENS,
        max_prompt_tokens=_AGENT_PROMPT_TOKENS,
        eos_id=codec.eos_ids,
        pad_id=codec.pad_id,
    )
    samples = [calculator.task.sample("validation", i) for i in range(prompts)]
    chats = [[{"role": "user", "content": s.prompt}] for s in samples]
    rewards = [0.0] * prompts
    decoder.submit(
        Request(i, tuple(codec.encode(template.render(chat, tools=_AGENT_TOOLS))), greedy=True)
        for i, chat in enumerate(chats)
    )
    while decoder.busy:
        for done in decoder.step():
            chat, sample = chats[done.tag], samples[done.tag]
            text = codec.decode(done.tokens)
            calls = _HERMES_CALL.findall(text)
            if done.truncated or not calls:
                chat.append({"role": "assistant", "content": text})
                if not done.truncated:
                    rewards[done.tag] = calculator.task.reward(sample, text)
                continue
            parsed = [_parsed_call(c) for c in calls]
            chat.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": str(n), "type": "function", "function": c} for n, c in enumerate(parsed)
            ]})  # fmt: skip
            if len(chat) >= 2 * tools_harness.MAX_TURNS:
                continue  # out of turns
            replied = template.render(chat, tools=_AGENT_TOOLS, add_generation_prompt=False)
            for n, call in enumerate(parsed):
                answer = tools_harness.tool_answer(call["name"], json.dumps(call["arguments"]))
                chat.append({"role": "tool", "tool_call_id": str(n), "content": answer})
            # The tokens sampled, then what the template renders after the assistant's turn.
            observation = template.render(chat, tools=_AGENT_TOOLS)[len(replied) :]
            prompt = (*done.prompt, *done.tokens, *codec.encode(observation))
            if len(prompt) <= _AGENT_PROMPT_TOKENS:
                decoder.submit([Request(done.tag, prompt, greedy=True)])
    model.train()
    return list(zip(chats, rewards, strict=True))


def _parsed_call(text: str) -> dict:
    try:
        call = json.loads(text)
    except ValueError:
        call = None
    if not isinstance(call, dict):
        return {"name": "", "arguments": {}}
    return {"name": str(call.get("name", "")), "arguments": call.get("arguments", {})}


def _source(args: argparse.Namespace) -> tuple[Path, dict]:
    """A fresh model directory holding the config both warm-ups train, and that config."""
    source = Path(tempfile.mkdtemp(prefix="asyncrl-warmup-"))
    config = BASE_CONFIG | {
        "eos_token_id": 1,
        "pad_token_id": 0,
        "max_position_embeddings": args.positions,
    }
    (source / "config.json").write_text(json.dumps(config))
    return source, config


def _fit(
    args: argparse.Namespace,
    source: Path,
    config: dict,
    batch: Callable[[int], Packed],
    reward: Callable[[CausalLM], float],
) -> Path:
    """Train the model of ``config`` (or ``--init``'s weights) on ``batch(start)``, the
    demonstrations from ``start`` on, scoring it with ``reward`` every ``--eval-every``
    steps, and save it with ``source``'s files to ``--out``."""
    model = CausalLM(ModelConfig.from_hf(config))
    # Another warm-up's model: rotary positions, so the weights do not depend on how many
    # there are; the agent's tokenizer keeps the calculator's characters' ids.
    if args.init:
        load_state(model, load_model(args.init)[0].state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98))
    started, score = time.monotonic(), 0.0
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, step / 50)
        packed = batch(step * args.batch)
        loss = -(response_logprobs(model, packed).sum() / packed.mask.sum())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % args.eval_every == 0:
            score = reward(model)
            elapsed = time.monotonic() - started
            print(
                f"step {step:5d}  loss {loss.item():.4f}  val reward {score:.3f}  {elapsed:.0f}s",
                flush=True,
            )
    save_model(model, source, args.out)
    print(f"saved to {args.out} (validation reward {score:.3f} on {args.val_prompts} prompts)")
    return args.out


def train_agent(args: argparse.Namespace) -> Path:
    """The agent model: the calculator's habits in the chat format (``--agent``)."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    source, config = _source(args)
    tokenizer = agent_tokenizer()
    assert tokenizer.get_vocab_size() <= config["vocab_size"]
    write_tokenizer_files(tokenizer, source)
    (source / "chat_template.jinja").write_text(AGENT_CHAT_TEMPLATE)
    codec, template = TextCodec.from_dir(source), ChatTemplate.from_dir(source)
    return _fit(
        args, source, config,
        lambda start: agent_demonstrations(
            codec, template, start, args.batch, args.slip, args.seed
        ),
        lambda model: agent_reward(model, codec, template, args.val_prompts),
    )  # fmt: skip


def train(args: argparse.Namespace) -> Path:
    if args.agent:
        return train_agent(args)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    task = load_task(args.task)
    tools = isinstance(task, calculator.CalculatorTask)
    code = isinstance(task, code_task.CodeTask)
    if not (tools or code or isinstance(task, Arithmetic)):
        raise SystemExit(
            f"--task {args.task}: the warm-up knows the arithmetic, calculator and code tasks"
        )
    source, config = _source(args)
    alphabet = calculator.ALPHABET if tools else code_task.ALPHABET if code else ALPHABET
    tokenizer = build_char_tokenizer(alphabet)
    assert tokenizer.token_to_id(EOS) == 1 and tokenizer.token_to_id(PAD) == 0
    write_tokenizer_files(tokenizer, source)
    codec = TextCodec.from_dir(source)

    def batch(start: int) -> Packed:
        if tools:
            return calculator_demonstrations(codec, start, args.batch, args.slip, args.seed)
        if code:
            return code_demonstrations(task, codec, start, args.batch, args.slip, args.seed)
        data = dataclasses.replace(task, long_tail=False)  # enough long sums to learn them
        return _batch(data, codec, start, args.batch, args.slip, args.seed)

    def reward(model: CausalLM) -> float:
        if tools:
            return calculator_reward(model, codec, args.val_prompts)
        return validation_reward(
            model, codec, task, args.val_prompts, max_new_tokens=args.max_new_tokens
        )

    return _fit(args, source, config, batch, reward)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=EMBEDDED_DIR)
    parser.add_argument("--task", default="asyncrl.actors.tasks.arithmetic:task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--agent", action="store_true", help="the calculator in the chat format (embedded-agent)"
    )
    parser.add_argument("--init", default="", help="start from this model (a packaged name or DIR)")
    parser.add_argument(
        "--slip", type=float, default=0.75, help="share of demonstrations with the task's bad habit"
    )
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--val-prompts", type=int, default=128)
    parser.add_argument(
        "--positions", type=int, default=128, help="max_position_embeddings: prompt + response"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=96, help="longest validation response, in tokens"
    )
    train(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
