"""data.environment is checked before any process starts: one line naming what is wrong."""

from __future__ import annotations

import pytest

from asyncrl.actors.startup.role_checks import check_environment
from asyncrl.runtime.contract.config import config_from_dict


def problems(environment: str, **data) -> list[str]:
    cfg = config_from_dict({"data": {"environment": environment, **data}})
    return check_environment(cfg)


def test_the_calculator_passes() -> None:
    cfg = config_from_dict(
        {
            "data": {"environment": "asyncrl.actors.tasks.calculator:Calculator"},
            "model": {"path": "embedded-calculator"},
        }
    )
    assert check_environment(cfg) == []


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("nope.env:Env", "data.environment='nope.env:Env': cannot import 'nope.env'"),
        ("no_colon", "data.environment='no_colon': expected an import path 'package.module:attr'"),
        (
            "tests.support.environments:NoStep",
            "data.environment='tests.support.environments:NoStep': not an environment (no step)",
        ),
        (
            "tests.support.environments:LongStop",
            "data.environment: stop text '+=' is 2 tokens of the model's vocabulary",
        ),
        (
            "tests.support.environments:refuses_to_be_made",
            "making one raised RuntimeError: no licence for the tool",
        ),
    ],
)
def test_a_bad_environment_is_one_line_naming_it(path: str, expected: str) -> None:
    (line,) = problems(path)
    assert expected in line and "\n" not in line


def test_an_environment_with_a_reward_function_is_refused_at_load() -> None:
    with pytest.raises(ValueError, match=r"reward: got 'math' with data\.environment set"):
        problems("asyncrl.actors.tasks.calculator:Calculator", reward="math")
