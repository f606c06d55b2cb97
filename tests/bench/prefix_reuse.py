"""A conversation's turns with and without kept caches, side by side in one run.

    python -m tests.bench.prefix_reuse [--turns 8] [--sessions 4] [--system 256] [--user 32]
        [--reply 32] [--rounds 2] [--layers 8] [--hidden 512]

Our own decoder (:class:`~asyncrl.actors.policy.decoder.Decoder`) holds ``--sessions``
conversations at once, as a generator holds a group's episodes or a harness's sessions.
Each starts with a prompt of ``--system`` tokens; each turn the model answers with
``--reply`` tokens (greedy), then ``--user`` new tokens follow, and the next turn's prompt
is the whole conversation so far: the sessions' turns are submitted together and the next
turn starts when all have ended (as an environment's or a harness's turns do). Two
decoders over one model: ``reuse``, whose requests keep their caches
(``Request.keep_cache``), and ``recompute``, whose do not (the decoder before kept caches
existed). They take turns (reuse first in the first round, recompute first in the next),
so that drift in the machine's load falls on both.

The model: random weights (normal, standard deviation 0.02) of a Llama shape of
``--layers`` layers and ``--hidden`` width, its vocabulary 4,096 tokens; no token ends a
response, so every turn is ``--reply`` tokens. Printed per turn (the median over rounds):
the prompt's tokens, the tokens each decoder computed keys and values for (the prompt's
part it fed, and the reply's), and the seconds the turn took each; then the totals, the
ratio of the times, and whether both decoders sampled the same tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from asyncrl.actors.policy.config import ModelConfig
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.policy.model import CausalLM

VOCABULARY = 4096


@dataclass
class Turns:
    """One decoder's conversation, turn by turn."""

    prompt_tokens: list[int] = field(default_factory=list)  # each turn's prompt, per session
    fed: list[int] = field(default_factory=list)  # tokens computed, all sessions
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # this process's
    replies: list[list[list[int]]] = field(default_factory=list)  # [turn][session]


def model_of(layers: int, hidden: int, context: int) -> CausalLM:
    heads = hidden // 64
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCABULARY,
        "hidden_size": hidden,
        "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "head_dim": 64,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": context,
        "tie_word_embeddings": True,
    }
    torch.manual_seed(0)
    model = CausalLM(ModelConfig.from_hf(config))
    with torch.no_grad():
        for matrix in (p for p in model.parameters() if p.dim() > 1):
            matrix.normal_(0.0, 0.02)
    return model.eval()


def converse(model: CausalLM, args: argparse.Namespace, keep: bool) -> Turns:
    """Every session's ``args.turns`` turns through a fresh decoder."""
    context = args.system + args.turns * (args.user + args.reply)
    decoder = Decoder(
        model,
        slots=args.sessions,
        max_new_tokens=args.reply,
        max_prompt_tokens=context,
        eos_id=VOCABULARY,  # never sampled: every reply runs its budget
        pad_id=0,
    )
    generator = torch.Generator().manual_seed(1)

    def tokens(count: int) -> list[int]:
        return torch.randint(1, VOCABULARY, (count,), generator=generator).tolist()

    conversations = [tokens(args.system) for _ in range(args.sessions)]
    turns = Turns()
    for turn in range(args.turns):
        fed = decoder.fed_tokens
        started, cpu = time.perf_counter(), time.process_time()
        decoder.submit(
            Request(s, tuple(c), greedy=True, keep_cache=keep) for s, c in enumerate(conversations)
        )
        done = {}
        while decoder.busy:
            done.update((f.tag, f) for f in decoder.step())
        turns.seconds.append(time.perf_counter() - started)
        turns.cpu_seconds.append(time.process_time() - cpu)
        turns.fed.append(decoder.fed_tokens - fed)
        turns.prompt_tokens.append(len(conversations[0]))
        turns.replies.append([done[s].tokens for s in range(args.sessions)])
        for s, conversation in enumerate(conversations):
            conversation += done[s].tokens
            if turn + 1 < args.turns:
                conversation += tokens(args.user)
    return turns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--system", type=int, default=256, help="first prompt's tokens")
    parser.add_argument("--user", type=int, default=32, help="new tokens between turns")
    parser.add_argument("--reply", type=int, default=32, help="tokens the model answers")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    context = args.system + args.turns * (args.user + args.reply) + args.reply
    model = model_of(args.layers, args.hidden, context)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"{args.sessions} sessions of {args.turns} turns: a {args.system}-token start, "
        f"{args.reply}-token replies, {args.user} new tokens between; a Llama shape of "
        f"{args.layers} layers, hidden {args.hidden} ({parameters / 1e6:.1f}M parameters), "
        f"float32, {torch.get_num_threads()} threads"
    )
    converse(model, argparse.Namespace(**{**vars(args), "turns": 2}), keep=True)  # warm-up
    runs: dict[str, list[Turns]] = {"reuse": [], "recompute": []}
    for round_ in range(args.rounds):
        order = ["reuse", "recompute"] if round_ % 2 == 0 else ["recompute", "reuse"]
        for name in order:
            runs[name].append(converse(model, args, keep=name == "reuse"))
    same = all(
        a.replies == b.replies for a, b in zip(runs["reuse"], runs["recompute"], strict=True)
    )
    print(
        f"{'turn':>4} {'prompt':>7} | {'reuse fed':>10} {'s':>7} {'cpu s':>7} | "
        f"{'recompute fed':>13} {'s':>7} {'cpu s':>7}"
    )

    def median(name: str, figure: str, turn: int) -> float:
        return statistics.median(getattr(r, figure)[turn] for r in runs[name])

    for turn in range(args.turns):
        reuse, recompute = runs["reuse"][0], runs["recompute"][0]
        print(
            f"{turn + 1:>4} {reuse.prompt_tokens[turn]:>7} | {reuse.fed[turn]:>10} "
            f"{median('reuse', 'seconds', turn):>7.3f} "
            f"{median('reuse', 'cpu_seconds', turn):>7.3f} | {recompute.fed[turn]:>13} "
            f"{median('recompute', 'seconds', turn):>7.3f} "
            f"{median('recompute', 'cpu_seconds', turn):>7.3f}"
        )
    fed = {name: sum(rounds[0].fed) for name, rounds in runs.items()}
    for figure in ("seconds", "cpu_seconds"):
        totals = {name: [sum(getattr(r, figure)) for r in rounds] for name, rounds in runs.items()}
        middle = {name: statistics.median(t) for name, t in totals.items()}
        print(
            f"total {'wall' if figure == 'seconds' else 'CPU'} seconds: reuse "
            f"{middle['reuse']:.2f} ({', '.join(f'{t:.2f}' for t in totals['reuse'])}), "
            f"recompute {middle['recompute']:.2f} "
            f"({', '.join(f'{t:.2f}' for t in totals['recompute'])}): recompute/reuse "
            f"{middle['recompute'] / middle['reuse']:.2f}x"
        )
    print(
        f"tokens computed: reuse {fed['reuse']:,}, recompute {fed['recompute']:,} "
        f"({fed['recompute'] / fed['reuse']:.2f}x); same tokens sampled: "
        f"{'yes' if same else 'NO'}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
