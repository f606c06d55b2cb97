"""The calculator task as an agent harness: the same episodes as the environment plays
(:mod:`.calculator`), written as any agent is, against the official ``openai`` client.

``data.harness: asyncrl.actors.tasks.calculator_harness:run`` (deploy/configs/
calculator-openai.yaml). The runtime calls ``run`` once per trajectory with a client bound
to a rollout session on a generator; every completion the harness asks for is recorded
there, token by token, and that is what is trained. Each call's prompt is the previous
call's prompt and completion plus the calculator's answer, so the session's calls extend
one another and are trained as one sequence with the answers masked out.
"""

from __future__ import annotations

from typing import Any

from .base import Sample
from .calculator import evaluate

__all__ = ["run"]

MAX_TURNS = 3
TURN_TOKENS = 16  # one call or one answer; the model's characters are tokens


async def run(sample: Sample, client: Any) -> float:
    """Play one episode; the reward is 1.0 for the right final answer."""
    transcript = sample.prompt
    for _ in range(MAX_TURNS):
        done = await client.completions.create(
            model="policy", prompt=transcript, max_tokens=TURN_TOKENS, stop=["]"]
        )
        choice = done.choices[0]
        turn = choice.text
        if choice.finish_reason == "length":
            return 0.0  # ran out of tokens mid-turn: neither a call nor an answer
        if not turn.startswith("["):  # not a calculator call: the final answer
            return 1.0 if turn.strip() == sample.answer else 0.0
        value = evaluate(turn[1:])
        # The stop text is not in the completion's text, but it is among its tokens.
        transcript += f"{turn}]{'?' if value is None else value};"
    return 0.0  # out of turns without an answer
