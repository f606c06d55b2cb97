"""``asyncrl run`` of the calculator config: multi-turn episodes in the generate role,
real processes. A flaky environment fails its groups with the reason; the run goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import default_run
from tests.support.cluster import processes_mentioning
from tests.support.default_run import records, run_config

pytestmark = pytest.mark.timeout(240)

STEPS = 4


def run_calculator(run_dir: Path, *overrides: str, config: str = "calculator.yaml") -> None:
    run_config(config, run_dir, STEPS, *overrides)


def test_the_calculator_config_trains_on_episodes_with_the_tool(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_calculator(run_dir)
    steps = default_run.steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # The base model calls the calculator and is right on about a third of the problems.
    assert 0 < sum(s["reward_mean"] for s in steps) / STEPS < 1
    # A trajectory holds the tool's answers too: longer than one model turn can be.
    assert max(s["response_len_max"] for s in steps) > 16
    assert processes_mentioning(str(run_dir)) == []


@pytest.mark.heavy  # 15-18 s: with the heavy tests, which CI runs
def test_an_environment_that_raises_fails_its_groups_and_the_run_goes_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_calculator(run_dir, "data.environment=tests.support.flaky_env:BreaksOnSevens")
    assert [s["step"] for s in default_run.steps(run_dir)] == list(range(1, STEPS + 1))
    failed = records(run_dir, "generate-0", "group failed")
    assert failed, "no problem's answer ended in 7"
    assert all(
        "environment 'tests.support.flaky_env:BreaksOnSevens': step raised KeyError: 'no tool for"
        in r["reason"]
        for r in failed
    )
    assert processes_mentioning(str(run_dir)) == []


# With the heavy tests (15 s), to keep the default suite under its time: the calculator
# config's own run and the harness runs stay in it.
@pytest.mark.heavy
def test_the_calculator_through_an_openai_client_harness_trains_the_same_episodes(
    tmp_path: Path,
) -> None:
    """deploy/configs/calculator-openai.yaml: the harness's calls extend one another, so
    each trajectory is one sequence holding the calculator's answers, as with the
    environment; the harness worker validates through the API at version 0 to the
    environment's own figure (the same greedy episodes)."""
    run_dir = tmp_path / "run"
    run_calculator(
        run_dir, "data.val_every_versions=10", "data.val_prompts=16",
        config="calculator-openai.yaml",
    )  # fmt: skip
    steps = default_run.steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert 0 < sum(s["reward_mean"] for s in steps) / STEPS < 1
    assert max(s["response_len_max"] for s in steps) > 16
    validation = json.loads((run_dir / "validation.jsonl").read_text().splitlines()[0])
    assert validation["worker"] == "harness-0" and validation["version"] == 0
    assert validation["val_reward"] == environment_greedy_reward(16)
    assert processes_mentioning(str(run_dir)) == []


def environment_greedy_reward(prompts: int) -> float:
    from asyncrl.actors.policy.checkpoint import load_model
    from tests.tools.warmup import calculator_reward

    model, codec = load_model("embedded-calculator")
    return calculator_reward(model, codec, prompts)


@pytest.mark.heavy  # with the other harness run above
def test_the_calculator_as_a_function_calling_agent_trains_each_episode_as_one_sequence(
    tmp_path: Path,
) -> None:
    """deploy/configs/calculator-tools.yaml: the openai client's chat calls with tools,
    over several turns an episode; the server splices each call onto the last, so each
    trajectory trains as one sequence of the ids sampled, the tool's answers untrained;
    validation through the API at version 0 is the warm-up's own greedy episodes."""
    from asyncrl.runtime.contract.rollout_dumps import read_rollouts

    run_dir = tmp_path / "run"
    run_calculator(
        run_dir, "data.val_every_versions=10", "data.val_prompts=16", "run.dump_rollouts=true",
        config="calculator-tools.yaml",
    )  # fmt: skip
    steps = default_run.steps(run_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert 0 < sum(s["reward_mean"] for s in steps) / STEPS < 1
    lines = [line for step in read_rollouts(run_dir / "rollouts").trained.values() for line in step]
    assert lines
    groups: dict[int, list[dict]] = {}
    for line in lines:
        groups.setdefault(line["gid"], []).append(line)
    for group in groups.values():  # one line (sequence) per trajectory
        assert sorted(line["trajectory"] for line in group) == list(range(len(group)))
    # Replies per episode: the model's end-of-sequence tokens (each reply ends with one).
    replies = [line["response_ids"].count(1) for line in lines]
    assert max(replies) >= 2 and sum(replies) / len(replies) > 1.5
    assert all(
        "<tool_call>" in line["response"] for line in lines if line["response_ids"].count(1) > 1
    )
    validation = json.loads((run_dir / "validation.jsonl").read_text().splitlines()[0])
    assert validation["worker"] == "harness-0" and validation["version"] == 0
    assert validation["val_reward"] == agent_greedy_reward(16)
    # Every later call of a session was spliced onto the one before; none rendered afresh.
    (stopped,) = records(run_dir, "generate-0", "stopped serving")
    assert stopped["chat_calls_spliced"] > 0 and stopped["chat_calls_rendered_afresh"] == {}
    assert processes_mentioning(str(run_dir)) == []


def agent_greedy_reward(prompts: int) -> float:
    from asyncrl.actors.policy.chat_template import ChatTemplate
    from asyncrl.actors.policy.checkpoint import load_model, model_dir
    from tests.tools.warmup import agent_reward

    model, codec = load_model("embedded-agent")
    return agent_reward(model, codec, ChatTemplate.from_dir(model_dir("embedded-agent")), prompts)
