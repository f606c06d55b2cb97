"""The warm-up that makes the packaged base models runs, and what it trains on."""

from __future__ import annotations

from pathlib import Path

from asyncrl.actors.policy.chat_template import ChatTemplate
from asyncrl.actors.policy.checkpoint import load_model
from asyncrl.actors.policy.tokenizer import TextCodec
from asyncrl.actors.tasks import calculator
from asyncrl.actors.tasks.calculator_tools_harness import CALCULATOR_TOOL
from tests.tools.warmup import calculator_demonstrations, main


def test_the_calculator_warm_up_makes_a_model_that_plays_episodes(tmp_path: Path) -> None:
    out = tmp_path / "calc"
    argv = ["--task", "asyncrl.actors.tasks.calculator:task", "--out", str(out)]
    argv += ["--steps", "2", "--batch", "8", "--eval-every", "2", "--val-prompts", "4"]
    assert main(argv) == 0
    model, codec = load_model(str(out))
    assert codec.encode("34*56+12=[]?;") == [codec.encode(c)[0] for c in "34*56+12=[]?;"]
    assert model.config.vocab_size >= len(calculator.ALPHABET) + 2


def test_calculator_demonstrations_train_the_model_turns_not_the_calculators() -> None:
    codec = TextCodec.from_dir(
        Path(calculator.__file__).parents[1] / "policy" / "embedded_calculator"
    )
    packed = calculator_demonstrations(
        codec, start=0, size=16, slip=0.0, seed=0
    )  # every one "full"
    for row in range(16):
        n = int(packed.lengths[row])
        start = int(packed.starts[row])
        text = codec.decode(packed.ids[row, start : start + n].tolist())
        call, _, rest = text.partition("]")
        answer_len = len(rest.partition(";")[2])
        mask = packed.mask[row, :n].tolist()
        # "[expr]" trained, "value;" not, the answer and end-of-sequence trained.
        tool = len(rest.partition(";")[0]) + 1
        assert mask == [1.0] * (len(call) + 1) + [0.0] * tool + [1.0] * (answer_len + 1)


def test_the_agent_warm_up_makes_a_chat_model_that_plays_episodes(tmp_path: Path) -> None:
    out = tmp_path / "agent"
    argv = ["--agent", "--out", str(out), "--steps", "2", "--batch", "8", "--eval-every", "2"]
    assert main([*argv, "--val-prompts", "4"]) == 0
    model, codec = load_model(str(out))
    template = ChatTemplate.from_dir(out)
    assert model.config.vocab_size == 32
    markers = ("<|assistant|>", "<tool_call>", "</tool_call>")
    assert [len(codec.encode(t)) for t in markers] == [1, 1, 1]
    messages = [{"role": "user", "content": "34*56="}]
    assert template.render(messages, tools=[CALCULATOR_TOOL]) == (
        "<|tools|><|user|>34*56=<|assistant|>"
    )
