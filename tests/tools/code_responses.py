"""What a code-task model writes: its greedy responses to the validation prompts, counted
by kind, and their mean reward (each run in the sandbox).

    python -m tests.tools.code_responses [MODEL] [--prompts 128]

MODEL is a packaged name or a directory (a run's ``final/``); ``embedded-code`` by
default. A response is the function's body (``reference``), the slip the warm-up's
demonstrations mostly made (``slip``), or anything else (``other``: another function,
or text that is none).
"""

from __future__ import annotations

import argparse
import collections
import sys

import structlog
import torch

from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder, Request
from asyncrl.actors.tasks.code import FUNCTIONS, task

__all__ = ["main", "response_kinds"]


def response_kinds(model_path: str, prompts: int) -> tuple[dict[str, int], float]:
    """How many greedy responses of each kind, and their mean reward."""
    model, codec = load_model(model_path)
    samples = [task.sample("validation", i) for i in range(prompts)]
    encoded = [tuple(codec.encode(sample.prompt)) for sample in samples]
    decoder = Decoder(
        model,
        slots=64,
        max_new_tokens=16,
        max_prompt_tokens=max(len(e) for e in encoded),
        eos_id=codec.eos_ids,
        pad_id=codec.pad_id,
    )
    decoder.submit(Request(i, e, greedy=True) for i, e in enumerate(encoded))
    responses: dict[int, str] = {}
    while decoder.busy:
        for done in decoder.step():
            responses[done.tag] = codec.decode(done.tokens)
    kinds: collections.Counter[str] = collections.Counter()
    total = 0.0
    for i, sample in enumerate(samples):
        body = sample.extra_info["reference"]
        response = responses[i]
        kinds[
            "reference" if response == body else "slip" if response == FUNCTIONS[body] else "other"
        ] += 1
        total += task.reward(sample, response)
    return dict(kinds), total / prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="embedded-code")
    parser.add_argument("--prompts", type=int, default=128)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    # Why each failed program scored 0 is the run's business, not this count's.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    kinds, reward = response_kinds(args.model, args.prompts)
    counts = ", ".join(f"{kinds.get(kind, 0)} {kind}" for kind in ("reference", "slip", "other"))
    print(f"{args.model}: {counts}; validation reward {reward:.3f} on {args.prompts} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
