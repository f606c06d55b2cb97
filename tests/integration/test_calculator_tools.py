"""The tool-calling calculator harness (actors/tasks/calculator_tools_harness.py) against a
generator's real API server and decoder serving embedded-agent, run as the harness role
runs it: its tool calls come back parsed, its episodes train as one sequence each, and
its greedy episodes through the API are the warm-up's own."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from asyncrl.actors.policy.chat_template import ChatTemplate
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.decoder import Decoder
from asyncrl.actors.policy.directories import model_dir
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.serving.directory import ApiDirectory, ApiEntry
from asyncrl.actors.serving.serving import Serving
from asyncrl.actors.serving.sessions import SessionRunner, load_harness
from asyncrl.actors.startup.model_loading import load_policy
from asyncrl.actors.tasks import calculator
from asyncrl.runtime.contract.config import config_from_dict
from asyncrl.runtime.contract.rundir import RunDir

pytestmark = pytest.mark.timeout(120)

HARNESS = "asyncrl.actors.tasks.calculator_tools_harness:run"
PROMPT_TOKENS, NEW_TOKENS = 104, 16  # deploy/configs/calculator-tools.yaml's


@dataclass
class Served:
    entry: ApiEntry
    codec: TextCodec


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("tools")
    cfg = config_from_dict(
        {
            "run": {"dir": str(root / "run")},
            "data": {"task": "asyncrl.actors.tasks.calculator:task", "harness": HARNESS},
            "model": {"path": "embedded-agent", "max_new_tokens": NEW_TOKENS,
                      "max_prompt_tokens": PROMPT_TOKENS},
        }
    )  # fmt: skip
    model, codec = load_policy(cfg, "generate")
    decoder = Decoder(model, slots=16, max_new_tokens=NEW_TOKENS, max_prompt_tokens=PROMPT_TOKENS,
                      eos_id=codec.eos_ids, pad_id=codec.pad_id)  # fmt: skip
    serving = Serving(cfg, "generate-0", codec, vocab_size=model.config.vocab_size,
                      max_prompt_tokens=PROMPT_TOKENS, version=0)  # fmt: skip
    (entry,) = ApiDirectory(RunDir.of(cfg).api_servers).live()
    stop = threading.Event()

    def decode() -> None:  # the generate worker's main thread, in short
        while not stop.is_set():
            serving.advance(decoder)
            if not decoder.busy:
                time.sleep(0.002)

    loop = threading.Thread(target=decode, daemon=True)
    loop.start()
    try:
        yield Served(entry, codec)
    finally:
        stop.set()
        loop.join(5)
        serving.stop()


def runner(served: Served) -> SessionRunner:
    return SessionRunner(
        load_harness(HARNESS), HARNESS, timeout_s=60, concurrency=8, servers=lambda: [served.entry]
    )


def test_episodes_call_the_tool_and_train_as_one_sequence_each(served: Served) -> None:
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


def test_greedy_episodes_through_the_api_are_the_warm_ups_own(served: Served) -> None:
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
    served: Served,
) -> None:
    """The same task as an Agents SDK agent (tests/support/calculator_agents_sdk.py): the
    SDK's own loop of calls and tool runs gets the same greedy rewards, and its sampled
    episodes train as one sequence each too."""
    pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install openai-agents")
    sdk = "tests.support.calculator_agents_sdk:run"
    samples = [calculator.task.sample("validation", i) for i in range(16)]
    by_hand, by_sdk = (
        runner(served),
        SessionRunner(
            load_harness(sdk), sdk, timeout_s=60, concurrency=8, servers=lambda: [served.entry]
        ),
    )
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
