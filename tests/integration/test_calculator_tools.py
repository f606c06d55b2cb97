"""The tool-calling calculator harness (actors/tasks/calculator_tools_harness.py) against a
generator's real API server and decoder serving embedded-agent, run as the harness role
runs it: its tool calls come back parsed, its episodes train as one sequence each, and
its greedy episodes through the API are the warm-up's own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from asyncrl.actors.policy.chat_template import ChatTemplate
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.directories import model_dir
from asyncrl.actors.serving.sessions import SessionRunner, load_harness
from asyncrl.actors.tasks import calculator
from tests.support.served_api import ServedApi, served_api

pytestmark = pytest.mark.timeout(120)

HARNESS = "asyncrl.actors.tasks.calculator_tools_harness:run"
PROMPT_TOKENS, NEW_TOKENS = 104, 16  # deploy/configs/calculator-tools.yaml's


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApi]:
    config = {
        "run": {"dir": str(tmp_path_factory.mktemp("tools") / "run")},
        "data": {"task": "asyncrl.actors.tasks.calculator:task", "harness": HARNESS},
        "model": {"path": "embedded-agent", "max_new_tokens": NEW_TOKENS,
                  "max_prompt_tokens": PROMPT_TOKENS},
    }  # fmt: skip
    with served_api(config, slots=16) as served:
        yield served


def runner(served: ServedApi, harness: str = HARNESS) -> SessionRunner:
    return SessionRunner(
        load_harness(harness), harness, timeout_s=60, concurrency=8, servers=lambda: [served.entry]
    )


def test_episodes_call_the_tool_and_train_as_one_sequence_each(served: ServedApi) -> None:
    sessions = runner(served)
    try:
        sample = calculator.task.sample("train", 7)  # 703*15+887=
        sequences, rewards = sessions.run_group(sample, 8, "g").result(60)
    finally:
        sessions.stop()
    assert sorted(s.owner for s in sequences) == list(range(8))  # one sequence each
    assert all(r in (0.0, 1.0) for r in rewards)
    codec, tool = served.codec, served.codec.tokenizer.token_to_id("<|tool|>")
    called = [s for s in sequences if tool in s.tokens]
    assert called, "no episode called the calculator"
    for sequence in called:
        tokens, trained = list(sequence.tokens), list(sequence.trained)
        text = codec.tokenizer.decode(tokens, skip_special_tokens=False)
        assert text.startswith("<|tools|><|user|>703*15+887=<|assistant|><tool_call>{")
        # Each tool answer and the next generation prompt are read, not trained; every
        # turn of the model (its call, its answer) is trained, up to its end token.
        for at in (i for i, t in enumerate(tokens) if t == tool):
            assert tokens[at - 1] == codec.eos_id and trained[at - 1]
            answer_end = tokens.index(codec.tokenizer.token_to_id("<|assistant|>"), at)
            assert not any(trained[at : answer_end + 1])
            assert trained[answer_end + 1]
        assert tokens[-1] == codec.eos_id and trained[-1]


def test_greedy_episodes_through_the_api_are_the_warm_ups_own(served: ServedApi) -> None:
    """Validation through the API (greedy sessions): the same replies, turn by turn, as
    the warm-up's episodes of the same model played on the decoder directly."""
    from tests.tools.warmup import agent_episodes

    prompts = 16
    samples = [calculator.task.sample("validation", i) for i in range(prompts)]
    sessions = runner(served)
    try:
        through_api = sessions.run_validation(samples, "v").result(60)
    finally:
        sessions.stop()
    model, codec = load_model("embedded-agent")  # the served one is the decode loop's
    template = ChatTemplate.from_dir(model_dir("embedded-agent"))
    played = agent_episodes(model, codec, template, prompts)
    assert through_api == [reward for _, reward in played]
    assert 0 < sum(through_api) < prompts


def test_an_agent_written_with_the_openai_agents_sdk_plays_the_same_episodes(
    served: ServedApi,
) -> None:
    """The same task as an Agents SDK agent (tests/support/calculator_agents_sdk.py): the
    SDK's own loop of calls and tool runs gets the same greedy rewards, and its sampled
    episodes train as one sequence each too."""
    pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install openai-agents")
    sdk = "tests.support.calculator_agents_sdk:run"
    samples = [calculator.task.sample("validation", i) for i in range(16)]
    by_hand, by_sdk = runner(served), runner(served, sdk)
    try:
        assert by_sdk.run_validation(samples, "s").result(60) == by_hand.run_validation(
            samples, "h"
        ).result(60)
        sequences, _ = by_sdk.run_group(calculator.task.sample("train", 7), 8, "sg").result(60)
    finally:
        by_hand.stop()
        by_sdk.stop()
    assert sorted(s.owner for s in sequences) == list(range(8))
    tool = served.codec.tokenizer.token_to_id("<|tool|>")
    assert any(tool in s.tokens for s in sequences), "no episode called the calculator"
