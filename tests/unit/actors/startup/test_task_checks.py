"""The data.task and data.reward checks made before a run starts
(actors/startup/role_checks.py): whatever a plug-in does wrong on import is one line
naming its key, never a traceback."""

from __future__ import annotations

import pytest

from asyncrl.actors.startup.role_checks import check_task
from asyncrl.runtime.contract.config import config_from_dict

BROKEN = "tests.support.plugin_that_raises:task"


def problems(**data: str) -> list[str]:
    return check_task(config_from_dict({"data": data}))


def test_the_default_task_passes() -> None:
    assert problems() == []


@pytest.mark.parametrize(
    ("data", "start"),
    [
        ({"task": "no_such_module:task"}, "data.task='no_such_module:task': cannot import"),
        ({"task": BROKEN}, f"data.task={BROKEN!r}: NameError: name 'tokenizer'"),
        ({"reward": BROKEN}, f"data.reward={BROKEN!r}: NameError: name 'tokenizer'"),
    ],
)
def test_a_plug_in_that_does_not_load_is_one_line_naming_its_key(
    data: dict[str, str], start: str
) -> None:
    (line,) = problems(**data)
    assert line.startswith(start) and "\n" not in line


CODE = "asyncrl.actors.tasks.code:task"


def test_a_task_that_needs_the_sandbox_is_refused_where_the_machine_cannot_give_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncrl.actors.sandbox as sandbox

    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: "unshare: Operation not permitted")
    assert problems(task=CODE) == [
        f"data.task={CODE!r}: its reward runs model-written code, and this machine cannot "
        "give it a sandbox: unshare: Operation not permitted"
    ]
    assert problems() == []  # the arithmetic task runs no code: it does not ask
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: None)
    assert problems(task=CODE) == []
