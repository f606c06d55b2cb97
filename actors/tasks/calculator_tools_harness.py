"""The calculator task as a function-calling agent: the calculator is a tool offered in
``tools``, the model calls it in the chat format, and its answers come back as ``tool``
messages, written as any agent on the official ``openai`` client is.

``data.harness: asyncrl.actors.tasks.calculator_tools_harness:run`` (deploy/configs/
calculator-tools.yaml, model ``embedded-agent``). One episode::

    user       34*56+12=
    assistant  tool_calls: calculator({"expression": "34*56+12"})
    tool       1916
    assistant  1916

The model may call the tool again before it answers (on the product first, then on the
rest: ``1904+12``); each reply is one chat call. Every call's tokens are recorded on the
generator, and the session's calls extend one another (the server keeps the tokens it
sampled), so a trajectory trains as one sequence with the tool's answers masked out. The
reward is 1.0 when the final answer is the expression's value.
"""

from __future__ import annotations

import json
from typing import Any

from .base import Sample
from .calculator import evaluate

__all__ = ["CALCULATOR_TOOL", "DISPLAY", "MAX_TURNS", "TURN_TOKENS", "run", "tool_answer"]

MAX_TURNS = 4  # model replies per episode: calls, then the answer
TURN_TOKENS = 16  # one call (the expression's characters and four tokens) or one answer
# The most characters the calculator shows (the task's values have at most 6): a longer
# value is "?", so a wild call cannot grow the conversation past the model's positions.
DISPLAY = 8

CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "The value of an arithmetic expression of whole numbers with + - *.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 34*56+12"}},
            "required": ["expression"],
        },
    },
}


def tool_answer(name: str, arguments: str) -> str:
    """What the calculator says to one call: the value, or ``?`` for a call it cannot
    read (another tool's name, arguments that are not JSON or hold no expression) or a
    value longer than its display."""
    if name != "calculator":
        return "?"
    try:
        expression = json.loads(arguments).get("expression")
    except (ValueError, AttributeError):
        return "?"
    value = evaluate(expression) if isinstance(expression, str) else None
    shown = "?" if value is None else str(value)
    return shown if len(shown) <= DISPLAY else "?"


async def run(sample: Sample, client: Any) -> float:
    """Play one episode; the reward is 1.0 for the right final answer."""
    messages: list[Any] = [{"role": "user", "content": sample.prompt}]
    for _ in range(MAX_TURNS):
        done = await client.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR_TOOL], max_tokens=TURN_TOKENS
        )
        choice = done.choices[0]
        if choice.finish_reason == "length":
            return 0.0  # ran out of tokens mid-turn: neither a call nor an answer
        message = choice.message
        if not message.tool_calls:  # the final answer
            return 1.0 if (message.content or "").strip() == sample.answer else 0.0
        messages.append(message)  # as the client returned it, tool calls and all
        for call in message.tool_calls:
            answer = tool_answer(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
    return 0.0  # out of turns without an answer
