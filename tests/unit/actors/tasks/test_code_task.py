"""The code task (actors/tasks/code.py): its samples, and its reward, which runs each
response as a program in the sandbox (real runs: skipped where this machine cannot give a
program a sandbox, with the reason)."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from asyncrl.actors.sandbox import sandbox_problem
from asyncrl.actors.tasks.code import ALPHABET, FUNCTIONS, CodeTask, program, task
from tests.support.hostile_code import ESCAPED, HOSTILE

WHY_NO_SANDBOX = sandbox_problem()
runs_programs = pytest.mark.skipif(
    WHY_NO_SANDBOX is not None, reason=f"no sandbox here: {WHY_NO_SANDBOX}"
)


def test_samples_are_a_pure_function_of_split_and_index() -> None:
    assert task.sample("train", 7) == CodeTask().sample("train", 7)
    train = {task.sample("train", i).answer for i in range(300)}
    validation = {task.sample("validation", i).answer for i in range(300)}
    assert len(train) == len(validation) == 300 and not train & validation


def test_a_prompt_shows_the_first_three_tests_in_the_models_alphabet() -> None:
    samples = [task.sample("train", i) for i in range(600)]
    for sample in samples:
        cases = task.cases(sample)
        assert sample.prompt == ";".join(map(str, cases[:3])) + ";f(a,b)="
        assert len({(c.a, c.b) for c in cases}) == 8  # the hidden inputs are new ones
        assert set(sample.prompt + sample.extra_info["reference"]) <= set(ALPHABET)
        assert len(sample.prompt) <= 37  # deploy/configs/code.yaml's prompts take 48
    assert {s.extra_info["reference"] for s in samples} == set(FUNCTIONS)


def test_a_bad_split_is_named() -> None:
    with pytest.raises(ValueError, match="split 'test'"):
        task.sample("test", 0)


def test_the_program_holds_the_inputs_but_not_the_expected_values() -> None:
    sample = task.sample("validation", 3)
    source = program("a", task.cases(sample))
    assert source.startswith("def f(a, b):\n    return a\n")
    assert all(f"({c.a}, {c.b})" in source for c in task.cases(sample))
    assert "want" not in source and sample.answer not in source


@runs_programs
def test_the_reference_passes_every_test_and_its_slip_fewer() -> None:
    for index in range(4):
        sample = task.sample("validation", index)
        reference = sample.extra_info["reference"]
        assert task.reward(sample, reference) == 1.0
        assert task.reward(sample, task.demonstration(sample, slip=True)) < 1.0
        assert task.demonstration(sample, slip=False) == reference


@runs_programs
def test_the_reward_is_the_share_of_tests_passed() -> None:
    """A lookup of the shown examples passes those three of the eight; a float where an
    int is expected passes none."""
    sample = task.sample("validation", 0)
    shown = {(c.a, c.b): c.want for c in task.cases(sample)[:3]}
    assert task.reward(sample, f"{shown}.get((a, b))") == 3 / 8
    assert task.reward(sample, f"float({sample.extra_info['reference']})") == 0.0


@runs_programs
def test_what_the_response_prints_itself_does_not_count() -> None:
    sample = task.sample("validation", 1)
    fake = '["0", "0", "0", "0", "0", "0", "0", "0"]'
    with capture_logs() as logs:
        assert task.reward(sample, f"print({fake!r}) or None") == 0.0
    assert logs == []  # it ran, and was wrong: no program to report


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("a+", "SyntaxError"),
        ("a\nraise SystemExit(3)", "status 3"),
        ("a\nprint('[1, 2]')\nimport sys\nsys.exit(0)", "not the 8 results"),
    ],
)
@runs_programs
def test_a_program_that_does_not_run_to_the_end_scores_0_with_its_reason_logged(
    response: str, reason: str
) -> None:
    with capture_logs() as logs:
        assert task.reward(task.sample("validation", 2), response) == 0.0
    (record,) = logs
    assert record["event"] == "program scored 0" and reason in record["reason"]
    assert record["response"] == response and record["log_level"] == "info"


@pytest.mark.parametrize("kind", list(HOSTILE))
@runs_programs
def test_a_hostile_program_scores_0_with_its_reason_logged(kind: str) -> None:
    hostile = CodeTask(timeout_s=1.0)
    with capture_logs() as logs:
        assert hostile.reward(task.sample("validation", 0), HOSTILE[kind]) == 0.0
    (record,) = logs
    assert record["event"] == "program scored 0" and record["reason"], record
    assert not Path(ESCAPED).exists()
    if kind in ("infinite loop", "huge output"):  # killed at a limit
        assert record["log_level"] == "warning", record


@runs_programs
def test_a_group_is_scored_at_once_as_each_alone() -> None:
    sample = task.sample("validation", 5)
    group = [sample.extra_info["reference"], task.demonstration(sample, slip=True), "a+", "b"]
    with capture_logs():
        assert task.reward.batch(sample, group) == [task.reward(sample, r) for r in group]


def test_the_code_config_holds_the_longest_prompt_and_response_on_its_packaged_model() -> None:
    from asyncrl.actors.policy.checkpoint import PACKAGED, load_model
    from asyncrl.runtime.contract.config import load_config

    cfg = load_config(Path(__file__).parents[4] / "deploy" / "configs" / "code.yaml")
    assert cfg.data.task == "asyncrl.actors.tasks.code:task" and cfg.model.path in PACKAGED
    _, codec = load_model(cfg.model.path)
    longest = max((task.sample("train", i) for i in range(2000)), key=lambda s: len(s.prompt))
    assert len(codec.encode(longest.prompt)) <= cfg.model.max_prompt_tokens
    assert max(len(codec.encode(body)) for body in FUNCTIONS) < cfg.model.max_new_tokens
    assert codec.decode(codec.encode(longest.prompt)) == longest.prompt  # no unknown token
