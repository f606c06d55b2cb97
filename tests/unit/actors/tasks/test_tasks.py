"""The task contract, the embedded arithmetic task, and loading task plug-ins."""

from __future__ import annotations

import math

import pytest

from asyncrl.actors.tasks import RewardFunction, Sample, TaskError, check_reward, load_task
from asyncrl.actors.tasks.arithmetic import Arithmetic, long_task, solution, task


def test_solution_writes_each_column_and_the_sum() -> None:
    assert solution(4589, 123) == "9+3+0=12,8+2+1=11,5+1+1=07,4+0+0=04;4712"
    assert solution(7, 5) == "7+5+0=12;12"


def test_the_carry_slip_drops_every_carry() -> None:
    assert solution(98, 57, carry=False) == "8+7+0=15,9+5+0=14;45"
    assert solution(48, 51, carry=False) == solution(48, 51)  # no carry: no difference


@pytest.mark.parametrize("index", range(200))
def test_the_reference_earns_the_reward_and_a_wrong_sum_does_not(index: int) -> None:
    sample = task.sample("train", index)
    assert task.reward(sample, task.reference(sample)) == 1.0
    wrong = task.reference(sample).rpartition(";")[0] + ";" + str(int(sample.answer) + 1)
    assert task.reward(sample, wrong) == 0.0
    assert task.reward(sample, "no answer") == 0.0


def test_samples_are_a_pure_function_of_split_and_index() -> None:
    assert task.sample("train", 7) == Arithmetic().sample("train", 7)
    train = {task.sample("train", i).prompt for i in range(300)}
    validation = {task.sample("validation", i).prompt for i in range(300)}
    assert len(train & validation) < 60  # short sums repeat; the draws are independent


def test_response_lengths_have_a_long_tail() -> None:
    lengths = sorted(len(task.reference(task.sample("train", i))) for i in range(2000))
    assert lengths[-1] >= 5 * lengths[0]
    assert lengths[len(lengths) // 2] < (lengths[0] + lengths[-1]) / 2  # most are short


def test_the_long_task_spreads_responses_over_11_to_302_tokens_half_of_them_short() -> None:
    # As deploy/configs/long_tail.yaml says; +1 for the end-of-sequence token.
    samples = [long_task.sample("train", i) for i in range(2000)]
    lengths = sorted(len(long_task.reference(s)) + 1 for s in samples)
    assert lengths[0] == 11 and 250 <= lengths[-1] <= 302
    assert sum(n <= 41 for n in lengths) >= 0.45 * len(lengths)  # about half (20,000: 51%)
    assert sum(n >= 200 for n in lengths) >= len(lengths) // 20  # a long tail, not a few
    assert max(len(s.prompt) for s in samples) <= 62  # 30 + 30 digits, '+' and '='


def test_bad_split_and_index_are_named() -> None:
    with pytest.raises(ValueError, match="split 'test'"):
        task.sample("test", 0)
    with pytest.raises(ValueError, match="index -1"):
        task.sample("train", -1)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon", "expected an import path"),
        ("asyncrl.no_such_module:task", "cannot import"),
        ("asyncrl.actors.tasks.arithmetic:nothing", "has no attribute 'nothing'"),
        ("asyncrl.actors.tasks.arithmetic:solution", "not a task"),
    ],
)
def test_a_bad_task_path_is_a_clear_error(path: str, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        load_task(path)


def test_the_embedded_task_loads_by_path() -> None:
    assert load_task("asyncrl.actors.tasks.arithmetic:task") is task


@pytest.mark.parametrize("value", [0, 1, 0.5, True, -3.0])
def test_numbers_are_rewards(value: float) -> None:
    assert check_reward(value, task="t") == float(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [("1.0", "returned str"), (None, "returned NoneType"), (math.nan, "not a finite")],
)
def test_a_reward_that_is_not_a_number_is_named(value: object, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        check_reward(value, task="my.task:t")


def test_the_reward_is_the_tasks_unless_a_plug_in_is_named() -> None:
    sample = task.sample("train", 0)
    own = RewardFunction.load("", task, "arithmetic")
    assert own(sample, task.reference(sample)) == 1.0
    plug_in = RewardFunction.load("tests.support.tasks:raising_reward", task, "arithmetic")
    assert plug_in.name == "tests.support.tasks:raising_reward"
    with pytest.raises(TaskError, match=r"data\.reward=.x:y.: cannot import"):
        RewardFunction.load("x:y", task, "arithmetic")
    with pytest.raises(TaskError, match="not callable"):
        RewardFunction.load("asyncrl.actors.tasks.arithmetic:task", task, "arithmetic")


def test_a_reward_that_raises_is_named_with_its_error() -> None:
    broken = RewardFunction(lambda s, r: 1 / 0, "my.plugin:f")
    with pytest.raises(TaskError, match=r"reward .my\.plugin:f. raised ZeroDivisionError"):
        broken(Sample("1+1=", "2"), "2")
