"""The tool-using calculator written with the OpenAI Agents SDK (``pip install
openai-agents``) instead of by hand: an ``Agent`` with the calculator as a function tool,
run by the SDK's ``Runner`` on its chat-completions model over the client the harness role
gives (``data.harness: tests.support.calculator_agents_sdk:run``). The SDK makes the
calls, runs the tool and sends its answers back; nothing here knows about training."""

from __future__ import annotations

import json

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from asyncrl.actors.tasks.calculator_tools_harness import MAX_TURNS, TURN_TOKENS, tool_answer

set_tracing_disabled(True)  # the SDK would send its traces to OpenAI


@function_tool
def calculator(expression: str) -> str:
    """The value of an arithmetic expression of whole numbers with + - *."""
    return tool_answer("calculator", json.dumps({"expression": expression}))


async def run(sample, client) -> float:
    agent = Agent(
        name="calculator",
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        model_settings=ModelSettings(max_tokens=TURN_TOKENS),
        tools=[calculator],
    )
    try:
        result = await Runner.run(agent, sample.prompt, max_turns=MAX_TURNS)
    except MaxTurnsExceeded:
        return 0.0
    return 1.0 if str(result.final_output).strip() == sample.answer else 0.0
